"""What ONNX Runtime's spinning intra-op threads cost: process CPU per run against run time.

Runs the benchmark ``digits`` model (``.bench/repository/digits/1/model.onnx``, built by
:mod:`bench.perf.models`) in one ``InferenceSession`` per setting, batches of 1, 6 and 32
rows (``--rows``), each run followed by a 2 ms pause (a worker between batches), and prints per setting
and batch: the wall time of ``session.run`` and the process CPU (user + system, all threads)
per run. The gap is what idle threads burn while spinning. Settings: ONNX Runtime's default
(intra-op threads = physical cores, spinning on), spinning off
(``session.intra_op.allow_spinning`` 0, Naiad's default: workers/backends/onnxruntime.py) and
one intra-op thread.

    .venv/bin/python -m bench.perf.ort_spinning --runs 300
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort

from bench.perf.models import DEFAULT_REPOSITORY, ensure_repository

SETTINGS = {
    "ONNX Runtime default": {},
    "spinning off (Naiad)": {"session.intra_op.allow_spinning": "0"},
    "1 intra-op thread": {"intra_op_num_threads": 1},
}


def session(path: str, setting: dict) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    for key, value in setting.items():
        if key.startswith("session."):
            options.add_session_config_entry(key, value)
        else:
            setattr(options, key, value)
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def measure(sess: ort.InferenceSession, rows: int, runs: int) -> tuple[float, float]:
    """(µs of wall time per run, µs of process CPU per run)."""
    name = sess.get_inputs()[0].name
    x = np.random.default_rng(0).random((rows, 64), dtype=np.float32)
    for _ in range(50):
        sess.run(None, {name: x})
    cpu0, run_s = time.process_time(), 0.0
    for _ in range(runs):
        started = time.perf_counter()
        sess.run(None, {name: x})
        run_s += time.perf_counter() - started
        time.sleep(0.002)
    return 1e6 * run_s / runs, 1e6 * (time.process_time() - cpu0) / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 6, 32], help="batch sizes")
    args = parser.parse_args()
    path = str(ensure_repository(DEFAULT_REPOSITORY) / "digits" / "1" / "model.onnx")
    print("| setting | rows | run wall µs | process CPU µs per run |")
    print("| --- | --- | --- | --- |")
    for label, setting in SETTINGS.items():
        sess = session(path, setting)
        for rows in args.rows:
            wall, cpu = measure(sess, rows, args.runs)
            print(f"| {label} | {rows} | {wall:.0f} | {cpu:.0f} |")


if __name__ == "__main__":
    main()
