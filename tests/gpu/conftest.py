"""GPU tests: they run only where NVML finds a GPU (CUDA present); anywhere else each one is
skipped with the reason. ``tests/gpu/run_on_device.sh`` runs them on a lent GPU machine, with
``--confcutdir tests/gpu`` (the suite's own conftest needs packages that machine lacks), so
this file puts the project and ``tests/`` on ``sys.path`` itself."""

from __future__ import annotations

import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
for _path in (HERE.parents[1], HERE.parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from naiad.host import GpuReader  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if HERE in pathlib.Path(str(item.path)).resolve().parents]
    if not ours:
        return
    reader = GpuReader()
    if reader.devices():
        return
    skip = pytest.mark.skip(reason=f"no CUDA GPU here ({reader.problem})")
    for item in ours:
        item.add_marker(skip)
