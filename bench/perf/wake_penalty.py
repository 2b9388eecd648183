"""What a process pays for having slept: one request's own code timed hot and right after
a sleep, on this machine.

A c1 request's path runs in processes that each sleep between requests (the gateway while
the worker runs, the worker between requests, the load generator while both work). This
times one step of that path, the gateway's JSON parse of the ``digits`` request
(:func:`gateway.http_codec.parse_infer_request`), five times in a row, either back to back
(hot) or after ``time.sleep`` of each given length, and prints the median of each of the
five calls. On the benchmark's 2-core VM (KVM, nested) the first call after a 0.5 ms sleep
took ~3× its hot time and the next ones still ~2× (docs/benchmarks.md, "Stop 41"): the
vCPU that idles loses its caches and its pace, so the c1 path's Python costs several
times what a profile of a busy process says, and fewer steps (calls, wake-ups) pay more
there than under load.

    .venv/bin/python -m bench.perf.wake_penalty --sleep-ms 0.1 0.5 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from bench.perf import loadgen
from bench.perf.models import target

CALLS = 5


def digits_parse() -> Callable[[], object]:
    """The gateway's parse of the peers benchmark's ``digits`` JSON request (one row of 64)."""
    from gateway.http_codec import parse_infer_request  # noqa: PLC0415

    body, _ = loadgen.http_body(target("127.0.0.1:1", "digits", protocol="http", encoding="json"))
    return lambda: parse_infer_request(body, None, "digits", 1)


def timed(step: Callable[[], object], before: Callable[[], object], rounds: int) -> list[float]:
    """Median µs of each of :data:`CALLS` calls of ``step`` in a row, each row after
    ``before()``, over ``rounds`` rows."""
    samples: list[list[int]] = [[] for _ in range(CALLS)]
    clock = time.perf_counter_ns
    for _ in range(rounds):
        before()
        for i in range(CALLS):
            start = clock()
            step()
            samples[i].append(clock() - start)
    return [statistics.median(s) / 1e3 for s in samples]


def run(sleeps_ms: Sequence[float], rounds: int) -> list[tuple[str, list[float]]]:
    """``[(condition, µs of calls 1..5)]``: hot, then after each sleep."""
    step = digits_parse()
    timed(step, lambda: None, rounds)  # warm: imports, caches of the interpreter
    rows = [("hot (back to back)", timed(step, lambda: None, rounds))]
    for ms in sleeps_ms:
        pause = ms / 1e3
        rows.append((f"after a {ms:g} ms sleep", timed(step, lambda s=pause: time.sleep(s), rounds)))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sleep-ms", type=float, nargs="+", default=[0.1, 0.5, 5.0])
    p.add_argument("--rounds", type=int, default=1500)
    args = p.parse_args(argv)
    rows = run(args.sleep_ms, args.rounds)
    hot = rows[0][1][0]
    command = " ".join(sys.argv[1:] if argv is None else argv)
    print(f"`python -m bench.perf.wake_penalty {command}`: `parse_infer_request` of the `digits` "
          f"JSON request, median µs of {args.rounds} rows\n")  # fmt: skip
    print("| condition | " + " | ".join(f"call {i + 1}" for i in range(CALLS)) + " | call 1 / hot |")
    print("| --- |" + " --- |" * (CALLS + 1))
    for name, micros in rows:
        print(f"| {name} | " + " | ".join(f"{us:.1f}" for us in micros) + f" | {micros[0] / hot:.1f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
