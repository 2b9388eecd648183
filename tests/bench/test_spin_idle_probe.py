"""``bench/perf/spin_idle.py``'s report: the median ratio and the gateway's shares come from
the windows given."""

from __future__ import annotations

from bench.perf.spin_idle import render


def window(rnd: int, idle: bool, rps: float, gateway: tuple[float, float]) -> dict:
    return {"round": rnd, "idle": idle, "rps": rps,
            "threads": {"gateway 1": gateway, "worker 2": (0.8, 0.1)}}  # fmt: skip


def test_the_report_gives_the_median_ratio_and_the_gateways_wait():
    rows = [window(1, False, 1000, (0.6, 0.4)), window(1, True, 1300, (0.7, 0.1)),
            window(2, True, 1100, (0.7, 0.2)), window(2, False, 1000, (0.6, 0.3)),
            window(3, False, 4000, (0.6, 0.5)), window(3, True, 1200, (0.7, 0.1))]  # fmt: skip
    text = render(rows, "python -m bench.perf.spin_idle")
    assert "**1.20×**" in text  # median 1200 over median 1000
    assert "0.40 normal, 0.10 SCHED_IDLE" in text
    assert text.count("| SCHED_IDLE |") == 3 and text.count("| normal |") == 3
