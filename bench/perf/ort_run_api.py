"""What ONNX Runtime's Python ``InferenceSession.run`` adds to a run, against the binding's own
``run`` (:func:`workers.backends.onnxruntime.direct_run`).

Loads the benchmark ``digits`` model (built by :mod:`bench.perf.models`) with Naiad's session
options, then times, interleaved in ``--rounds`` rounds of ``--runs`` runs each, one batch of
``--rows`` rows through ``session.run`` and through the binding, in a warm loop; prints the
median run time of each (µs) and their ratio.

    .venv/bin/python -m bench.perf.ort_run_api --rows 1 8 32
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from bench.perf.models import DEFAULT_REPOSITORY, ensure_repository
from workers.backends.onnxruntime import OnnxRuntimeBackend, direct_run


def median_us(run, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        run()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    repository = ensure_repository(DEFAULT_REPOSITORY)
    session = OnnxRuntimeBackend(repository / "digits" / "1" / "model.onnx", "cpu").session
    binding = direct_run(session)
    assert binding is not None, "no binding run on this ONNX Runtime"
    name, outputs = session.get_inputs()[0].name, [o.name for o in session.get_outputs()]
    print("| rows | session.run µs | binding run µs | ratio |\n| --- | --- | --- | --- |")
    for rows in args.rows:
        feed = {name: np.random.default_rng(0).random((rows, 64), dtype=np.float32)}
        wrapped, direct = [], []
        for _ in range(args.rounds):
            wrapped.append(median_us(lambda: session.run(outputs, feed), args.runs))  # noqa: B023
            direct.append(median_us(lambda: binding(outputs, feed, None), args.runs))  # noqa: B023
        w, d = statistics.median(wrapped), statistics.median(direct)
        print(f"| {rows} | {w:.1f} | {d:.1f} | {d / w:.2f} |")


if __name__ == "__main__":
    main()
