"""The soak's short variant (bench/soak.py, ~20 s): a steady rate, workers SIGKILLed, Redis
killed and restarted once (AOF on); nothing lost, duplicated or wrong."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from naiad_harness import ROOT


@pytest.mark.timeout(150)
def test_short_soak_loses_nothing(example_repository, tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--duration-s", "20", "--rate", "15",
         "--kill-every-s", "6", "--redis-restart-at-s", "9", "--repository", str(example_repository),
         "--workdir", str(tmp_path / "soak")],
        capture_output=True, text=True, timeout=140,
    )  # fmt: skip
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-3000:]}"
    summary = json.loads(result.stdout)
    assert summary["lost"] == summary["duplicated"] == summary["wrong"] == 0
    assert summary["answered"] > 0.8 * summary["sent"]
    assert not summary["failed"], summary
    assert any("redis started again" in event for event in summary["events"])
    assert sum("SIGKILL every worker process: pids [" in e and "[]" not in e for e in summary["events"]) >= 2
