"""``bench/cold_start.py``'s report: every phase the worker logs has its column."""

from __future__ import annotations

from bench.cold_start import row_of, table
from workers.cold_start import cold_start_phases
from workers.loader import VersionLoad


def test_every_worker_phase_is_a_column_warmup_included():
    origin, ready = 100.0, 102.0
    loads = [VersionLoad(1, pull_s=0.125, load_s=0.25, warmup_s=0.375)]
    phases = cold_start_phases(origin, {"start": 100.5, "registry": 100.75}, loads, ready)
    record = {"origin": origin, "seconds": ready - origin, "warm_pool": False, **phases}
    row = row_of(record, sent=99.5, total=3.0, compute_s=0.01, hot=0.002)
    assert {k: row[k] for k in phases} == phases
    rendered = table({("digits", "pool"): [row]})
    head, _, cells = (line.strip("| ").split(" | ") for line in rendered.splitlines())
    shown = dict(zip(head, cells, strict=True))
    # after model, mode, runs, p50/p90/max, total − load, to worker
    assert list(phases) == head[8 : 8 + len(phases)]
    assert (shown["warmup"], shown["load"], shown["to worker"]) == ("375.0", "250.0", "500.0")
    assert shown["to answer"] == "500.0"  # sent + total - ready
    assert shown["total − load p50"] == "2750.0"  # what the cold start cost beyond the model's load
    assert (shown["model"], shown["mode"]) == ("digits", "warm pool (onnxruntime)")
