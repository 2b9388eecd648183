"""Two source trees of Naiad side by side, interleaved: which change pays, on a noisy VM.

This machine's speed drifts by ±20–40 % over minutes (docs/benchmarks.md), so two separate
runs do not rank a change of a few percent. This runs each tree's ``naiad serve`` (embedded
Redis, the benchmark repository) in turn, ``--rounds`` times, alternating which goes first,
and reports each run's throughput and what a request cost (:mod:`bench.perf.costs`: CPU µs
per process kind, Redis commands and reads per request, mean batch). A change is kept when it
wins in every round.

    git worktree add /tmp/base HEAD          # the commit before the change
    .venv/bin/python -m bench.perf.ab --tree /tmp/base --tree . --rounds 3 --duration 6

Each tree runs with this checkout's ``.venv`` and its own sources first on ``PYTHONPATH``.
One tree twice with ``--change-arg`` compares two settings instead::

    .venv/bin/python -m bench.perf.ab --tree . --tree . --change-arg=--gateway-processes=2

and ``--change-env NAME=VALUE`` an environment variable of the change's server only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from bench.perf import loadgen
from bench.perf.models import DEFAULT_REPOSITORY, ROOT, ensure_repository, target
from bench.perf.servers import running, start_naiad

KINDS = ("server", "redis-server", "worker")


def measure(tree: Path, args: argparse.Namespace, repo: Path) -> dict:
    """One server start of ``tree``: ``--warmup`` s of load, then ``--duration`` s measured."""
    workdir = ROOT / ".bench" / "logs" / "ab" / tree.resolve().name
    change = tree is args.tree[1]
    extra = args.change_arg if change else []
    env = dict(pair.split("=", 1) for pair in args.change_env) if change else {}
    python = args.change_python if change and args.change_python else sys.executable
    server = start_naiad(repo, workdir, [args.model], extra_args=extra, tree=tree.resolve(), env=env,
                         python=python)
    with running(server):
        url = server.grpc_url if args.protocol == "grpc" else server.http_url
        tgt = target(url, args.model, protocol=args.protocol, encoding=args.encoding)
        series = loadgen.run(lambda: loadgen.measure(
            tgt, concurrency=[args.concurrency], warmup_s=args.warmup, duration_s=args.duration,
            server_pids=[server.pid], stats_url=server.http_url.removeprefix("http://"),
        ))  # fmt: skip
    return series["points"][0]


def row(name: str, rnd: int, point: dict) -> str:
    costs = point.get("costs", {})
    cpu = costs.get("cpu_us_per_request", {})
    parts = [f"{cpu.get(k, 0):.0f}" for k in KINDS]
    total = sum(cpu.get(k, 0) for k in KINDS)
    redis = costs.get("redis", {})
    batch = costs.get("batches", {}).get("mean_size")
    client = point.get("client_cpu", 0.0) * 1e6 / max(point["throughput_rps"], 1e-9)
    return (f"| {rnd} | {name} | {point['throughput_rps']:.0f} | {point['latency_ms']['p50']:.2f} | "
            f"{' + '.join(parts)} = {total:.0f} | {client:.0f} | {redis.get('commands_per_request', '-')} / "
            f"{redis.get('reads_per_request', '-')} | {batch} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", type=Path, action="append", required=True, help="a Naiad checkout (twice)")
    p.add_argument("--change-arg", action="append", default=[],
                   help="repeatable: a flag of the change's naiad serve only, e.g. "
                   "--change-arg=--gateway-processes=2 (with --tree . twice: one tree, two settings)")
    p.add_argument("--change-env", action="append", default=[], metavar="NAME=VALUE",
                   help="repeatable: an environment variable of the change's naiad serve (and its "
                   "workers) only, e.g. --change-env=PYTHONMALLOC=malloc")
    p.add_argument("--change-python", help="the interpreter of the change's naiad serve (another venv's "
                   "bin/python, Naiad installed there), e.g. another CPython build")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default="digits")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--protocol", choices=["http", "grpc"], default="http")
    p.add_argument("--encoding", choices=["json", "binary"], default="json")
    p.add_argument("--warmup", type=float, default=2.5)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    args = p.parse_args(argv)
    if len(args.tree) != 2:
        p.error("give --tree twice: the base, then the change")
    repo = ensure_repository(args.repository)
    print(f"`python -m bench.perf.ab {' '.join(sys.argv[1:] if argv is None else argv)}`\n")
    print("| round | tree | req/s | p50 ms | CPU µs/req gateway + redis + worker = total "
          "| client µs/req | Redis cmds / reads per req | mean batch |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    results: dict[int, list[float]] = {0: [], 1: []}
    for rnd in range(1, args.rounds + 1):
        order = (0, 1) if rnd % 2 else (1, 0)
        for i in order:
            point = measure(args.tree[i], args, repo)
            results[i].append(point["throughput_rps"])
            print(row("base" if i == 0 else "change", rnd, point), flush=True)
    ratio = statistics.median(results[1]) / max(statistics.median(results[0]), 1e-9)
    print(f"\nmedian req/s: base {statistics.median(results[0]):.0f}, change "
          f"{statistics.median(results[1]):.0f} ({ratio:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
