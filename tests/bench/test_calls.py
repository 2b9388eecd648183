"""The call-count tool (:mod:`bench.perf.calls`): its hook in a real child process, and how
it reports the counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.perf.calls import per_request, role
from bench.perf.models import ROOT
from bench.perf.timeline import HOOK

CHILD = """
import os, sys, time
sys.path.insert(0, {folder!r})
import counted

folder = os.environ["NAIAD_CALLS_DIR"]
counted.work(0)  # before 'on': not counted
open(os.path.join(folder, "on"), "w").close()
while not any(name.startswith("counting-") for name in os.listdir(folder)):
    time.sleep(0.005)
for i in range(5):
    counted.work(i)
open(os.path.join(folder, "off"), "w").close()
while not any(name.startswith("calls-") and name.endswith(".json") for name in os.listdir(folder)):
    time.sleep(0.01)
"""


def test_the_hook_counts_the_calls_between_on_and_off(tmp_path: Path) -> None:
    module = "def helper(n):\n    return n + 1\n\ndef work(n):\n    return helper(n) * 2\n"
    (tmp_path / "counted.py").write_text(module)
    folder = tmp_path / "counts"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(HOOK), "NAIAD_CALLS_DIR": str(folder)}
    child = subprocess.run([sys.executable, "-c", CHILD.format(folder=str(tmp_path))], env=env, timeout=60)
    assert child.returncode == 0
    (path,) = folder.glob("calls-*.json")
    found = json.loads(path.read_text())
    counted = {key.rsplit(":", 1)[1]: n for key, n in found["calls"].items() if "counted.py" in key}
    assert counted == {"work": 5, "helper": 5}
    assert found["argv"] == ["-c"]
    # times of the same window: work's inclusive time holds helper's, its self time does not
    times = {kind: {key.rsplit(":", 1)[1]: t for key, t in found[f"{kind}_s"].items() if "counted.py" in key}
             for kind in ("self", "inclusive")}  # fmt: skip
    assert set(found["self_s"]) == set(found["inclusive_s"]) == set(found["calls"])
    inner = times["inclusive"]["helper"] + times["self"]["work"]
    assert times["inclusive"]["work"] == pytest.approx(inner, rel=1e-6, abs=1e-9) and inner > 0
    assert 0 < times["self"]["helper"] <= times["inclusive"]["helper"]


def test_counts_are_shown_a_request_most_called_first_with_short_paths() -> None:
    calls = {f"{ROOT}/gateway/http.py:201:answer_infer": 40, "<built-in method builtins.len>": 240,
             "/usr/lib/python3/site-packages/msgpack/__init__.py:30:packb": 20}  # fmt: skip
    assert per_request(calls, 20) == [("<built-in method builtins.len>", 12.0),
                                      ("gateway/http.py:201:answer_infer", 2.0),
                                      ("msgpack/__init__.py:30:packb", 1.0)]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["/x/naiad_cli/__main__.py", "worker", "--pool", "--model-repository", "r"], "worker"),
     (["/x/naiad_cli/__main__.py", "gateway"], "gateway"),
     (["/x/naiad_cli/__main__.py", "serve", "--model-repository", "r"], "serve"),
     (["/x/naiad/guard.py", "26416", "3"], "/x/naiad/guard.py 26416 3")],
)  # fmt: skip
def test_a_process_is_named_by_its_part(argv: list[str], expected: str) -> None:
    assert role(argv) == expected
