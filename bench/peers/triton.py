"""How to run real Triton 2.51 from the ``nvidia-pytriton`` wheel, in one place for the
``peers`` benchmark (``.bench/venvs/triton``, ``make bench-setup``) and the differential test
suite (``.venv-triton``, ``make triton-venv``; ``tests/differential/triton_server.py``).

The wheel (PyPI ``nvidia-pytriton==0.7.0``, the Makefile's ``PYTRITON``) ships
``pytriton/tritonserver/bin/tritonserver`` with the Python backend
(``backends/python/libtriton_python.so``) and a Python-backend stub per Python version
(``python_backend_stubs/3.X/triton_python_backend_stub``), no other backend. As the wheel's own
launcher does: the stub for the venv's Python goes next to ``libtriton_python.so`` in a private
backend folder, the venv's ``bin/`` first on ``PATH`` (the stub runs model.py with that venv's
Python and packages) and the wheel's bundled libraries on ``LD_LIBRARY_PATH`` (the stub needs
its libcudart even on a CPU).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class TritonMissing(RuntimeError):
    """No ``tritonserver`` in the venv (it was not created, or the install failed)."""


def triton_home(venv: Path) -> Path:
    """The wheel's ``pytriton/tritonserver`` folder inside ``venv``; :class:`TritonMissing`."""
    found = sorted(venv.glob("lib/python3.*/site-packages/pytriton/tritonserver/bin/tritonserver"))
    if not found:
        raise TritonMissing(f"no tritonserver under {venv}: install the Makefile's PYTRITON there")
    return found[0].parents[1]


def backend_directory(home: Path, workdir: Path) -> Path:
    """A private ``--backend-directory`` under ``workdir`` holding the Python backend and the
    stub for the venv's Python (the ``python3.X`` folder the wheel is installed under; made
    again if it exists)."""
    backends = workdir / "backends"
    python = backends / "python"
    shutil.rmtree(backends, ignore_errors=True)
    shutil.copytree(home / "backends" / "python", python)
    version = home.parents[2].name.removeprefix("python")  # lib/python3.X/site-packages/pytriton/...
    stub = home / "python_backend_stubs" / version / "triton_python_backend_stub"
    shutil.copy2(stub, python / stub.name)
    return backends


def environment(venv: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the venv's ``bin/`` first on PATH,
    the wheel's libraries on LD_LIBRARY_PATH and no PYTHONPATH (the stub must import the
    venv's packages, not ours)."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    libs = sorted(venv.glob("lib/python3.*/site-packages/nvidia_pytriton.libs"))
    paths = [*(str(p) for p in libs), *filter(None, [env.get("LD_LIBRARY_PATH")])]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(paths)
    env.pop("PYTHONPATH", None)
    return env


def command(
    venv: Path, repository: Path, backends: Path, http_port: int, grpc_port: int, metrics_port: int,
    extra: list[str] | None = None,
) -> list[str]:  # fmt: skip
    """``tritonserver`` serving ``repository`` on loopback ports with ``backends``
    (:func:`backend_directory`)."""
    home = triton_home(venv)
    return [
        str(home / "bin" / "tritonserver"),
        "--model-repository", str(repository),
        "--backend-directory", str(backends),
        "--cache-directory", str(home / "caches"),
        "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
        "--exit-timeout-secs", "5",
        *(extra or []),
    ]  # fmt: skip
