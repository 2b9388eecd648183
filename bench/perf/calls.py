"""Python function calls a request, per Naiad process, under closed-loop load: a cost that does
not swing with the VM's speed (timings on this machine vary ~2× within the hour).

Starts ``naiad serve`` on the benchmark repository with :mod:`bench.perf.timeline`'s hook on
its ``PYTHONPATH`` and ``NAIAD_CALLS_DIR`` set: every Naiad process then runs under
:mod:`cProfile` (its main thread, the event loop's: a Python model's own thread is not
counted) and writes the calls its functions took between two files the tool touches around
``--duration`` seconds of closed-loop load (``--concurrency`` clients, 1 by default). Prints,
per process (the gateway, each worker), the calls a request (every call: Python functions,
builtins and C methods; a coroutine counts once per resumption, as cProfile counts it) and
the functions called most, with each one's self and inclusive time a request (``--by self``
or ``inclusive`` orders by them). A request is one the model answered between the two files
(its statistics, Triton's extension). Under the profiler the server runs 2–3× slower and each
call costs more: the counts are the result, the times are shares.

    .venv/bin/python -m bench.perf.calls --model digits --encoding json --duration 3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

from bench.perf import loadgen
from bench.perf.models import DEFAULT_REPOSITORY, ROOT, target
from bench.perf.servers import running, start_naiad
from bench.perf.timeline import hooked_run, written


def per_request(calls: dict[str, float], requests: float) -> list[tuple[str, float]]:
    """``calls`` (by function) divided by ``requests``, most called first; paths under the
    project or a ``site-packages`` shortened."""
    rows = []
    for key, count in calls.items():
        short = key.replace(f"{ROOT}/", "").split("site-packages/")[-1]
        rows.append((short, count / requests))
    return sorted(rows, key=lambda row: (-row[1], row[0]))


def answered(http_url: str, model: str) -> int:
    """The requests ``model`` answered so far (Triton's statistics extension: ``success`` +
    ``fail`` counts): the calls between the files ``on`` and ``off`` are divided by the
    requests the server answered between them, not by the load generator's count of its
    measured window (at c32, half of them)."""
    url = f"http://{http_url.removeprefix('http://')}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as answer:
        stats = json.load(answer)["model_stats"]
    return sum(s["inference_stats"][kind]["count"] for s in stats for kind in ("success", "fail"))


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
    p.add_argument("--concurrency", type=int, default=1, help="clients in the closed loop")
    p.add_argument("--top", type=int, default=15, help="functions listed per process")
    p.add_argument(
        "--by",
        choices=["calls", "self", "inclusive"],
        default="calls",
        help="order the functions by calls, or by self or inclusive time (µs a request under the "
        "profiler: cProfile slows each call, read them as shares)",
    )
    p.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    args = p.parse_args(argv)
    folder, path, repository = hooked_run(p, args.model, args.repository, "calls", "counts")
    env = {"NAIAD_CALLS_DIR": str(folder / "counts"), "PYTHONPATH": path}
    with running(start_naiad(repository, folder, [args.model], env=env)) as server:
        url = server.grpc_url if args.protocol == "grpc" else server.http_url
        tgt = target(url, args.model, protocol=args.protocol, encoding=args.encoding)
        loadgen.run(
            lambda: loadgen.measure(tgt, concurrency=[args.concurrency], warmup_s=args.warmup, duration_s=0.5)
        )
        before = answered(server.http_url, args.model)
        (folder / "counts" / "on").touch()
        time.sleep(0.2)  # each process looks every 20 ms
        series = loadgen.run(
            lambda: loadgen.measure(
                tgt, concurrency=[args.concurrency], warmup_s=0.0, duration_s=args.duration
            )
        )
        (folder / "counts" / "off").touch()
        time.sleep(0.2)
        served = answered(server.http_url, args.model) - before
        found = [json.loads(path.read_text()) for path in written(folder / "counts", "calls")]
    point = series["points"][0]
    requests = served
    print(f"`python -m bench.perf.calls {' '.join(sys.argv[1:] if argv is None else argv)}`: {requests} "
          f"requests counted ({point['throughput_rps']:.0f} req/s under the profiler)\n")  # fmt: skip
    for process in found:
        rows = per_request(process["calls"], max(requests, 1))
        total = sum(n for _, n in rows)
        if total < 1:
            continue  # an idle process (a warm-pool one, the second gateway process)
        python = sum(n for key, n in rows if not key.startswith("<"))
        print(f"**{role(process['argv'])}**: {total:.0f} calls a request, {python:.0f} of Python functions\n")
        times = {kind: dict(per_request(process.get(f"{kind}_s", {}), max(requests, 1) / 1e6))
                 for kind in ("self", "inclusive")}  # fmt: skip
        if args.by != "calls":
            rows = sorted(rows, key=lambda row: -times[args.by].get(row[0], 0.0))
        print("| calls a request | self µs | inclusive µs | function |\n| --- | --- | --- | --- |")
        for key, n in rows[: args.top]:
            own, whole = times["self"].get(key, 0.0), times["inclusive"].get(key, 0.0)
            print(f"| {n:.2f} | {own:.1f} | {whole:.1f} | `{key}` |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
