"""The c1 timeline tool (:mod:`bench.perf.timeline`): its hook in a real child process, and
the cycles and steps it computes from marks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.perf.timeline import HOOK, READ, SENT, quarters, steps

CHILD = """
import asyncio, os, sys, time
sys.path.insert(0, {folder!r})
import marked
import sitecustomize  # the hook, first on the path

folder = os.environ["NAIAD_TIMELINE_DIR"]
while marked.work.__name__ != "wrapped" or marked.waited.__name__ != "wrapped":
    time.sleep(0.005)
marked.work(1)  # wrapped, before 'on': not marked
open(os.path.join(folder, "ready"), "w").close()
while not sitecustomize._on[0]:
    time.sleep(0.005)
marked.work(2)
marked.Thing().method()
asyncio.run(marked.waited())
open(os.path.join(folder, "off"), "w").close()
while not any(name.startswith("marks-") for name in os.listdir(folder)):
    time.sleep(0.01)
"""

MODULE = """
import asyncio

def work(n):
    return n * 2

class Thing:
    def method(self):
        return work(3)

async def waited():
    await asyncio.sleep(0.005)
"""


def test_the_hook_marks_sync_and_async_calls_once_on(tmp_path: Path) -> None:
    (tmp_path / "marked.py").write_text(MODULE)
    folder = tmp_path / "marks"
    folder.mkdir()
    targets = "marked:work,marked:Thing.method,marked:waited,absent:nothing"
    env = {**os.environ, "PYTHONPATH": str(HOOK), "NAIAD_TIMELINE_DIR": str(folder),
           "NAIAD_TIMELINE_TARGETS": targets}  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(folder=str(tmp_path))], env=env)
    try:
        deadline = time.monotonic() + 30
        while not (folder / "ready").exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        (folder / "on").touch()
        assert child.wait(30) == 0
    finally:
        child.kill()
    (path,) = folder.glob("marks-*.json")
    names = [name for name, _ in json.loads(path.read_text())]
    method = ["Thing.method<", "work<", "work>", "Thing.method>"]
    assert names == ["work<", "work>", *method, "waited<", "waited>"]
    times = [ns for _, ns in json.loads(path.read_text())]
    assert times == sorted(times)
    assert times[-1] - times[-2] >= 5_000_000  # a coroutine's mark waits for its end: the sleep


def _cycle(start_ns: int, gaps_us: list[float], names: list[str]) -> list[tuple[str, int]]:
    marks, ns = [(names[0], start_ns)], start_ns
    for name, gap in zip(names[1:], gaps_us, strict=True):
        ns += int(gap * 1000)
        marks.append((name, ns))
    return marks


def test_steps_take_the_common_sequence_and_its_medians() -> None:
    path = [SENT, "A<", "A>", READ]
    marks: list[tuple[str, int]] = []
    for i, gaps in enumerate([[10, 20, 30], [12, 22, 32], [14, 24, 34], [40, 50, 60]]):
        marks += _cycle(1_000_000 * (i + 1), gaps, path)
    marks += _cycle(9_000_000, [1, 1, 1, 1], [SENT, "A<", "B<", "A>", READ])  # another way: out
    rows, total, kept, cycles = steps(list(reversed(marks)))  # any order: sorted by time
    assert (kept, cycles) == (4, 5)
    assert [(a, b) for a, b, _, _ in rows] == [(SENT, "A<"), ("A<", "A>"), ("A>", READ)]
    assert [p50 for _, _, p50, _ in rows] == pytest.approx([13, 23, 33])
    assert [mean for _, _, _, mean in rows] == pytest.approx([19, 29, 39])
    assert total == pytest.approx(69)  # the median of 60, 66, 72, 150


def test_quarters_set_the_fastest_requests_steps_beside_the_slowest() -> None:
    """Eight cycles: the two slowest lose their time in the second step alone, so the
    quarters differ there and nowhere else."""
    path = [SENT, "A<", "A>", READ]
    marks: list[tuple[str, int]] = []
    for i, late in enumerate([0, 0, 0, 0, 0, 0, 100, 120]):
        marks += _cycle(1_000_000 * (i + 1), [10, 20 + late, 30], path)
    rows, fast, slow = quarters(marks)
    assert [(a, b) for a, b, _, _ in rows] == [(SENT, "A<"), ("A<", "A>"), ("A>", READ)]
    assert [late - quick for _, _, quick, late in rows] == pytest.approx([0, 110, 0])
    assert (fast, slow) == pytest.approx((60, 170))


def test_no_request_marked_is_an_error() -> None:
    with pytest.raises(SystemExit):
        steps([("A<", 1), ("A>", 2)])
