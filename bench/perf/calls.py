"""Python function calls a request, per Naiad process, under c1 load: a cost that does not
swing with the VM's speed (timings on this machine vary ~2× within the hour).

Starts ``naiad serve`` on the benchmark repository with :mod:`bench.perf.timeline`'s hook on
its ``PYTHONPATH`` and ``NAIAD_CALLS_DIR`` set: every Naiad process then runs under
:mod:`cProfile` (its main thread, the event loop's: a Python model's own thread is not
counted) and writes the calls its functions took between two files the tool touches around
``--duration`` seconds of closed-loop load at concurrency 1. Prints, per process (the
gateway, each worker), the calls a request (every call: Python functions, builtins and C
methods; a coroutine counts once per resumption, as cProfile counts it) and the functions
called most. Under the profiler the server runs 2–3× slower: the counts, not its speed, are
the result.

    .venv/bin/python -m bench.perf.calls --model digits --encoding json --duration 3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.perf import loadgen
from bench.perf.models import DEFAULT_REPOSITORY, ROOT, target
from bench.perf.servers import running, start_naiad
from bench.perf.timeline import hooked_run, written


def per_request(calls: dict[str, int], requests: int) -> list[tuple[str, float]]:
    """``calls`` (by function) divided by ``requests``, most called first; paths under the
    project or a ``site-packages`` shortened."""
    rows = []
    for key, count in calls.items():
        short = key.replace(f"{ROOT}/", "").split("site-packages/")[-1]
        rows.append((short, count / requests))
    return sorted(rows, key=lambda row: (-row[1], row[0]))


def role(argv: list[str]) -> str:
    """A process's part from its command line (``naiad <command> ...``): ``serve`` (the
    server's first process: a gateway, the scaler and the keeper of the others), ``gateway``
    (a sibling gateway on the same ports: a connection lands on one of them), ``worker``, or
    its first words."""
    command = next((word for word in argv[1:2] if not word.startswith("-")), "")
    return command if command in ("gateway", "worker", "serve") else " ".join(argv)[:60]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--model", default="digits", help="a model of the benchmark repository")
    p.add_argument("--protocol", choices=["http", "grpc"], default="http")
    p.add_argument("--encoding", choices=["json", "binary"], default="json", help="HTTP body")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of load before counting")
    p.add_argument("--duration", type=float, default=3.0, help="seconds of load counted")
    p.add_argument("--top", type=int, default=15, help="functions listed per process")
    p.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    args = p.parse_args(argv)
    folder, path, repository = hooked_run(p, args.model, args.repository, "calls", "counts")
    env = {"NAIAD_CALLS_DIR": str(folder / "counts"), "PYTHONPATH": path}
    with running(start_naiad(repository, folder, [args.model], env=env)) as server:
        url = server.grpc_url if args.protocol == "grpc" else server.http_url
        tgt = target(url, args.model, protocol=args.protocol, encoding=args.encoding)
        loadgen.run(lambda: loadgen.measure(tgt, concurrency=[1], warmup_s=args.warmup, duration_s=0.5))
        (folder / "counts" / "on").touch()
        time.sleep(0.2)  # each process looks every 20 ms
        series = loadgen.run(
            lambda: loadgen.measure(tgt, concurrency=[1], warmup_s=0.0, duration_s=args.duration)
        )
        (folder / "counts" / "off").touch()
        found = [json.loads(path.read_text()) for path in written(folder / "counts", "calls")]
    point = series["points"][0]
    requests = point["requests"] + point["errors"]
    print(f"`python -m bench.perf.calls {' '.join(sys.argv[1:] if argv is None else argv)}`: {requests} "
          f"requests counted ({point['throughput_rps']:.0f} req/s under the profiler)\n")  # fmt: skip
    for process in found:
        rows = per_request(process["calls"], max(requests, 1))
        total = sum(n for _, n in rows)
        if total < 1:
            continue  # an idle process (a warm-pool one, the second gateway process)
        python = sum(n for key, n in rows if not key.startswith("<"))
        print(f"**{role(process['argv'])}**: {total:.0f} calls a request, {python:.0f} of Python functions\n")
        print("| calls a request | function |\n| --- | --- |")
        for key, n in rows[: args.top]:
            print(f"| {n:.2f} | `{key}` |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
