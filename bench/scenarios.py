"""Benchmark scenarios, one command each: start the servers compared, load them, stop them, report.

    .venv/bin/python -m bench.scenarios overhead|throughput|peers|coldstart|cache [options]

Every load scenario builds the benchmark repository if needed (:mod:`bench.perf.models`), runs
the servers one after another (each alone on the machine while measured, stopped after), drives
each with the same load generator (:mod:`bench.perf.loadgen`) and writes ``NAME.json``,
``NAME.md`` and ``NAME.png`` under ``--out`` (default ``bench/results``); server logs go to
``.bench/logs/NAME/``, the previous run's to ``.bench/logs/NAME.prev/``.

- ``overhead``: ``tiny`` (an Identity node) at concurrency 1: the floor, Naiad over HTTP (binary
  tensors) and over gRPC. What Naiad adds per request.
- ``throughput``: ``digits`` and ``digits_cnn`` swept over ``--concurrency`` (1…64), Naiad with
  dynamic batching on and off (two configs differing only in ``dynamic_batching``) and the floor,
  HTTP with binary tensors. Targets: ``digits_cnn`` c32 batched ≥ 2× unbatched and ≥ 1.5× floor.
- ``peers``: the digits MLP behind the floor, real Triton 2.51 (its Python backend running
  ``bench/peers/digits_python/model.py``), Naiad (the same ``model.py`` in its Python backend, and
  the ONNX graph in its ONNX backend), MLServer 1.7 (adaptive batching off and on; the better one
  counts) and KServe 0.21: JSON, binary tensors and gRPC where the server speaks them. Targets
  (:func:`peer_targets`): against Triton, c32 throughput ≥ 1× (must 0.8×) and c1 p50 ≤ 1.2× (must
  1.5×) per encoding; against MLServer's best (JSON), c32 ≥ 2×. Reference lines beside them:
  the grpc.aio floor against Triton's gRPC, and what Naiad's c32 points could reach at their
  measured costs (:func:`bounds`). ``--rounds N`` runs every server N times, in a rotated
  order each round, and reports each point's median round (:func:`median_series`; this VM's
  speed drifts by ±40 % over minutes, so one round's ratios move with whichever servers a
  slow spell fell on). Needs ``make bench-setup``.
- ``coldstart`` / ``cache``: run ``bench/cold_start.py`` / ``bench/cache_zipf.py`` on the
  benchmark repository's ``digits`` (arguments after ``--`` go to them) and keep their Markdown
  under ``--out``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.perf import loadgen, report
from bench.perf.models import DEFAULT_REPOSITORY, ROOT, ensure_repository, target
from bench.perf.servers import (
    Server,
    run_folder,
    running,
    start_floor,
    start_kserve,
    start_mlserver,
    start_naiad,
    start_triton,
)
from gateway.siblings import process_count
from naiad.settings import Settings

DEFAULT_LEVELS = {"overhead": [1], "throughput": [1, 2, 4, 8, 16, 32, 64], "peers": [1, 8, 32]}


class Run:
    """One scenario run: its options, log folder and the series measured so far."""

    def __init__(self, name: str, args: argparse.Namespace):
        self.name, self.args = name, args
        self.levels = args.concurrency or DEFAULT_LEVELS[name]
        self.logs = run_folder(ROOT / ".bench" / "logs", name)
        self.series: list[dict] = []

    def measure(self, server: Server, label: str, tgt: loadgen.Target, group: str) -> dict:
        args = self.args
        series = loadgen.run(
            lambda: loadgen.measure(
                tgt,
                concurrency=self.levels,
                warmup_s=args.warmup,
                duration_s=args.duration,
                server_pids=[server.pid],
                label=label,
                stats_url=server.http_url,
            ),
            args.loop,
        )
        series.update(group=group, server={"name": server.name, "args": server.args[1:]})
        summary = ", ".join(
            f"c{p['concurrency']} {p['throughput_rps']:.0f}/s p50 {p['latency_ms']['p50']} ms"
            for p in series["points"]
        )
        print(f"{label}: {summary}", file=sys.stderr, flush=True)
        self.series.append(series)
        return series

    def get(self, label: str) -> dict | None:
        return next((s for s in self.series if s["label"] == label), None)


def point(series: dict | None, concurrency: int) -> dict | None:
    if series is None:
        return None
    found = next((p for p in series["points"] if p.get("concurrency") == concurrency), None)
    return found if found and found["requests"] else None


def ratio(
    name: str, num: dict | None, den: dict | None, goal: float, must: float | None = None,
    key: str = "throughput_rps",
) -> dict:  # fmt: skip
    """Target ``num[key] / den[key] >= goal`` (and ``>= must``, the floor of acceptance;
    ``met`` None when a point is missing)."""
    value = quotient(num, den, key)
    if value is None:
        return {"name": name, "value": None, "goal": _goal("≥", goal, must), "met": None}
    target_ = {"name": name, "value": value, "goal": _goal("≥", goal, must), "met": value >= goal}
    if must is not None:
        target_["must_met"] = value >= must
    return target_


def naiad_args(run: Run) -> list[str]:
    return list(run.args.naiad_arg)


# -- scenarios -------------------------------------------------------------------------------


def overhead(run: Run, repo: Path) -> dict:
    with running(start_floor(repo, run.logs, ["tiny"])) as floor:
        run.measure(floor, "floor http", target(floor.http_url, "tiny"), "tiny")
    with running(start_naiad(repo, run.logs, ["tiny"], naiad_args(run))) as naiad:
        run.measure(naiad, "naiad http", target(naiad.http_url, "tiny"), "tiny")
        run.measure(naiad, "naiad grpc", target(naiad.grpc_url, "tiny", protocol="grpc"), "tiny")
    notes = []
    floor_p = point(run.get("floor http"), 1)
    for label in ("naiad http", "naiad grpc"):
        p = point(run.get(label), 1)
        if p and floor_p:
            added = p["latency_ms"]["p50"] - floor_p["latency_ms"]["p50"]
            notes.append(
                f"{label}: p50 {p['latency_ms']['p50']:.2f} ms = floor + {added:.2f} ms "
                f"({p['latency_ms']['p50'] / floor_p['latency_ms']['p50']:.1f}× the floor)."
            )
    return {"notes": notes}


def throughput(run: Run, repo: Path) -> dict:
    models = ["digits", "digits_cnn"]
    with running(start_floor(repo, run.logs, models)) as floor:
        for model in models:
            run.measure(floor, f"{model} floor", target(floor.http_url, model), model)
    with running(
        start_naiad(repo, run.logs, [*models, *(f"{m}_nobatch" for m in models)], naiad_args(run))
    ) as n:
        for model in models:
            run.measure(n, f"{model} naiad batching", target(n.http_url, model), model)
            run.measure(n, f"{model} naiad no batching", target(n.http_url, f"{model}_nobatch"), model)
    cnn, c = "digits_cnn", 32
    return {
        "targets": [
            ratio(
                f"{cnn} c{c}: batching / no batching",
                point(run.get(f"{cnn} naiad batching"), c),
                point(run.get(f"{cnn} naiad no batching"), c),
                2.0,
            ),
            ratio(
                f"{cnn} c{c}: batching / floor",
                point(run.get(f"{cnn} naiad batching"), c),
                point(run.get(f"{cnn} floor"), c),
                1.5,
            ),
            ratio(
                f"digits c{c}: naiad batching / floor",
                point(run.get("digits naiad batching"), c),
                point(run.get("digits floor"), c),
                0.5,
            ),
        ]
    }


#: The peers scenario's encodings: (label suffix, protocol, HTTP body encoding).
ENCODINGS = (("json", "http", "json"), ("binary", "http", "binary"), ("grpc", "grpc", "binary"))


def peers(run: Run, repo: Path) -> dict:
    """Every server on the digits MLP, one after another. Naiad and Triton serve the same
    Python-backend ``model.py`` (``digits_python``); Naiad also its ONNX backend on the same
    graph and scheduling (``digits_onnx``: ``max_batch_size: 32``, ``dynamic_batching { }``,
    issue 14's setup); the floor, MLServer and KServe the ONNX graph (``digits``). JSON,
    binary tensors and gRPC where the server speaks them (the floor, MLServer and KServe: JSON)."""
    onnx, python, naiad_onnx = "digits", "digits_python", "digits_onnx"
    logs = run.logs
    starters: list[tuple[str, Callable[[], Server], list[tuple[str, str]]]] = [
        ("floor", lambda: start_floor(repo, logs, [onnx]), [("floor", onnx)]),
        ("triton", lambda: start_triton(repo, logs, [python]), [("triton python", python)]),
        ("naiad", lambda: start_naiad(repo, logs, [naiad_onnx, python], naiad_args(run)),
         [("naiad onnx", naiad_onnx), ("naiad python", python)]),
        ("mlserver", lambda: start_mlserver(repo, logs, onnx, adaptive_batching=False), [("mlserver", onnx)]),
        ("mlserver", lambda: start_mlserver(repo, logs, onnx, True, name="mlserver-batching"),
         [("mlserver adaptive batching", onnx)]),
        ("kserve", lambda: start_kserve(repo, logs, onnx), [("kserve", onnx)]),
    ]  # fmt: skip
    starters = [s for s in starters if not run.args.only or s[0] in run.args.only]
    rounds = run.args.rounds
    for rnd in range(rounds):
        for name, start, measured in round_order(starters, rnd):
            with running(start()) as server:
                settle(server, [target(server.http_url, model, "http", "json") for _, model in measured])
                for label, model in measured:
                    for suffix, protocol, encoding in encodings(run, SPOKEN.get(name, ("json",))):
                        url = server.grpc_url if protocol == "grpc" else server.http_url
                        tgt = target(url, model, protocol, encoding)
                        run.measure(server, f"{label} {suffix}", tgt, suffix)["round"] = rnd + 1
    if rounds == 1:
        return peer_targets(run)
    every, run.series = run.series, median_series(run.series)
    return {**peer_targets(run), "rounds": every, "notes": [rounds_note(run.series, rounds)]}


def round_order(items: list, rnd: int) -> list:
    """``items`` rotated by ``rnd`` (round 0 as given): each round starts with another."""
    first = rnd % len(items) if items else 0
    return items[first:] + items[:first]


#: :func:`settle`: a server tree counts as quiet under this many cores over each window of
#: ``QUIET_WINDOW_S`` for ``QUIET_FOR_S`` in a row (longer than a warm pool's refill delay,
#: ``workers.warm_pool.REFILL_DELAY_S``), and is waited for at most ``SETTLE_S`` seconds.
QUIET_CORES, QUIET_WINDOW_S, QUIET_FOR_S, SETTLE_S = 0.05, 0.5, 3.0, 30.0


def settle(server: Server, targets: Sequence[loadgen.Target]) -> None:
    """Before a server's first measured point: one request to each model it will be measured on
    (a server that starts workers on demand starts them now: Naiad's cold start claims a
    warm-pool process, and the pool starts its replacement a second later, importing ONNX
    Runtime), then a wait until its process tree has been quiet for :data:`QUIET_FOR_S`
    (under :data:`QUIET_CORES` in every :data:`QUIET_WINDOW_S`; at most :data:`SETTLE_S`).
    Every server gets the same, so each is measured in its steady state (Triton loads its
    models at start; before this, the replacement's import could land in Naiad's first
    point: 500–570 µs of worker CPU a request at c1 against 287 in a round where it did not,
    peers-stop27)."""
    for tgt in targets:
        loadgen.run(lambda tgt=tgt: _prime(tgt))
    tree, deadline = loadgen.ProcessTreeCpu([server.pid]), time.monotonic() + SETTLE_S
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        before = tree.seconds()
        time.sleep(QUIET_WINDOW_S)
        if (tree.seconds() - before) / QUIET_WINDOW_S >= QUIET_CORES:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= QUIET_FOR_S:
            return


async def _prime(tgt: loadgen.Target) -> None:
    client = loadgen.make_client(tgt)
    try:
        await loadgen.probe(client, tgt, 60.0)
    finally:
        await client.close()


def median_series(series: list[dict]) -> list[dict]:
    """One series per label from several rounds' (the first round's order): at each load
    level the point whose throughput is the median of the rounds' (the lower one of an even
    count), carrying every round's throughput as ``round_rps`` (in round order)."""
    labels = list(dict.fromkeys(s["label"] for s in series))
    merged = []
    for label in labels:
        runs = [s for s in series if s["label"] == label]
        points = []
        for level in [p["concurrency"] for p in runs[0]["points"]]:
            found = [p for s in runs if (p := point(s, level))]
            if not found:
                continue
            ranked = sorted(found, key=lambda p: p["throughput_rps"])
            median = ranked[(len(ranked) - 1) // 2]
            points.append({**median, "round_rps": [p["throughput_rps"] for p in found]})
        merged.append({**runs[0], "points": points, "round": None})
    return merged


def rounds_note(series: list[dict], rounds: int) -> str:
    """The Markdown note of a run of several rounds: how its points were chosen, and each
    point's throughput in every round."""
    lines = [f"Each point above is the median of {rounds} rounds by throughput (the servers run in a "
             "rotated order each round, so a slow spell of the VM falls on different servers); "
             "req/s in each round:", "",
             "| series | load | req/s by round |", "| --- | --- | --- |"]  # fmt: skip
    for s in series:
        for p in s["points"]:
            by_round = " · ".join(f"{r:.0f}" for r in p.get("round_rps", []))
            lines.append(f"| {s['label']} | c{p['concurrency']} | {by_round} |")
    return "\n".join(lines)


#: The encodings each peers server is measured with, where not JSON alone: Triton and Naiad
#: all; the floor also gRPC (what a ``grpc.aio`` front costs at least, beside Triton's).
SPOKEN = {
    "triton": ("json", "binary", "grpc"),
    "naiad": ("json", "binary", "grpc"),
    "floor": ("json", "grpc"),
}


def encodings(run: Run, spoken: Sequence[str]) -> list[tuple[str, str, str]]:
    """The :data:`ENCODINGS` of ``spoken`` a server is measured with; ``--encoding``
    narrows them."""
    return [e for e in ENCODINGS if e[0] in spoken and (not run.args.encoding or e[0] in run.args.encoding)]


def at_most(name: str, num: dict | None, den: dict | None, goal: float, must: float | None = None) -> dict:
    """Target ``num`` p50 / ``den`` p50 ≤ ``goal`` (and ≤ ``must``, the floor of acceptance)."""
    value = quotient(num, den, "p50")
    if value is None:
        return {"name": name, "value": None, "goal": _goal("≤", goal, must), "met": None}
    target_ = {"name": name, "value": value, "goal": _goal("≤", goal, must), "met": value <= goal}
    if must is not None:
        target_["must_met"] = value <= must
    return target_


def _goal(sign: str, goal: float, must: float | None) -> str:
    return f"{sign} {goal:g}×" + (f" (must {sign} {must:g}×)" if must is not None else "")


def peer_targets(run: Run) -> dict:
    """Issue 14's targets, per encoding: Naiad (ONNX and Python backend) against Triton's
    Python backend on the same model.py (c32 throughput ≥ 1× (must 0.8×); c1 p50 ≤ 1.2×
    (must 1.5×)), and against MLServer's better configuration (JSON, c32 ≥ 2×)."""
    ml = [s for s in (run.get("mlserver json"), run.get("mlserver adaptive batching json")) if s]
    ml32 = max((point(s, 32) for s in ml if point(s, 32)), key=lambda p: p["throughput_rps"], default=None)
    targets = []
    for suffix, _, _ in ENCODINGS:
        triton = run.get(f"triton python {suffix}")
        for backend in ("onnx", "python"):
            label = f"naiad {backend} {suffix}"
            naiad = run.get(label)
            targets += [
                ratio(f"c32 {label} / triton (throughput)", point(naiad, 32), point(triton, 32), 1.0, 0.8),
                at_most(f"c1 {label} / triton (p50)", point(naiad, 1), point(triton, 1), 1.2, 1.5),
            ]
            if suffix != "grpc":
                targets.append(ratio(f"c32 {label} / MLServer best (throughput)", point(naiad, 32), ml32, 2))
    # Not a target of Naiad's: how near Triton's gRPC a grpc.aio front can come at all.
    floor, triton = run.get("floor grpc"), run.get("triton python grpc")
    name = "reference: {} floor grpc (grpc.aio, no queue) / triton ({})"
    targets += [
        reference(name.format("c32", "throughput"), point(floor, 32), point(triton, 32)),
        reference(name.format("c1", "p50"), point(floor, 1), point(triton, 1), key="p50"),
    ]
    return {"targets": targets + bounds(run, loadgen.cores())}


def quotient(num: dict | None, den: dict | None, key: str = "throughput_rps") -> float | None:
    """``num[key] / den[key]`` of two points (``key`` "p50": their latencies' p50); None when
    either is missing."""
    if num is None or den is None:
        return None
    if key == "p50":
        return num["latency_ms"]["p50"] / den["latency_ms"]["p50"]
    return num[key] / den[key]


def reference(name: str, num: dict | None, den: dict | None, key: str = "throughput_rps") -> dict:
    """A reference line of the targets table: :func:`quotient`, no goal, never met or missed."""
    return {"name": name, "value": quotient(num, den, key), "goal": "—", "met": None}


def bounds(run: Run, cores: int) -> list[dict]:
    """Reference lines, not targets: the most Naiad's c32 points could reach on this
    machine at their measured costs, over Triton's throughput in the same run (which moves
    by ±30 % from run to run, so these do too). *Gateway loops*: each gateway process is
    one event loop, at most one core, so ``N`` of them (``--gateway-processes``; by
    default one a CPU, at most two) carry at most N × 10⁶ / (their CPU µs a request)
    requests a second (one gRPC connection reaches one of them only; process CPU: over
    HTTP the loop thread carries nearly all of it,
    ``bench/results/profile-digits_python-c32-json.md``: 106 µs a request, the process
    0.59 cores at 5,549 req/s; over gRPC grpc's own threads carry part, so there the loops'
    own bound is somewhat higher); *all cores*: ``cores`` over the request's CPU in every
    process (server tree and load generator). A point near a bound is held by what the
    bound counts; a point below both waits on something (a round trip, a batch)."""
    lines = []
    for suffix, _, _ in ENCODINGS:
        triton = point(run.get(f"triton python {suffix}"), 32)
        for backend in ("onnx", "python"):
            series = run.get(f"naiad {backend} {suffix}")
            name = f"reference: c32 naiad {backend} {suffix}, {{}} bound / triton"
            loops, all_cores = cost_bounds(point(series, 32), cores, gateway_processes(series))
            lines += [reference(name.format("gateway loops'"), loops, triton),
                      reference(name.format("all cores'"), all_cores, triton)]  # fmt: skip
    return lines


def gateway_processes(series: dict | None) -> int:
    """The gateway processes a Naiad series' server ran with: its recorded
    ``--gateway-processes``, or for none (or 0) the default's count on this machine
    (:func:`gateway.siblings.process_count`)."""
    args = [str(a) for a in ((series or {}).get("server") or {}).get("args", [])]
    asked = 0
    for i, arg in enumerate(args):
        if arg.startswith("--gateway-processes="):
            asked = int(arg.partition("=")[2])
        elif arg == "--gateway-processes" and i + 1 < len(args):
            asked = int(args[i + 1])
    return process_count(Settings(gateway_processes=asked))


def cost_bounds(
    measured: dict | None, cores: int, processes: int = 1
) -> tuple[dict | None, dict | None]:  # fmt: skip
    """``(gateway loops, all cores)``: :func:`bounds`' two ceilings of a point with its costs
    (:mod:`bench.perf.costs`; ``server`` sums every gateway process), on ``cores`` cores with
    ``processes`` gateway processes, as ``{"throughput_rps": ...}``; None where a figure is
    missing."""
    cpu = ((measured or {}).get("costs") or {}).get("cpu_us_per_request") or {}
    if not cpu.get("server") or not measured["throughput_rps"]:
        return None, None
    client_us = measured.get("client_cpu", 0.0) * 1e6 / measured["throughput_rps"]
    total_us = sum(cpu.values()) + client_us
    loops = min(processes, cores) * 1e6 / cpu["server"]
    return {"throughput_rps": loops}, {"throughput_rps": cores * 1e6 / total_us}


SCENARIOS: dict[str, Callable[[Run, Path], dict]] = {
    "overhead": overhead,
    "throughput": throughput,
    "peers": peers,
}
SCRIPTS = {"coldstart": "cold_start.py", "cache": "cache_zipf.py"}


def run_script(name: str, script_args: Sequence[str], out: Path, command: list[str]) -> Path:
    """Run one of the older scenario scripts and keep its Markdown output."""
    args = [sys.executable, str(ROOT / "bench" / SCRIPTS[name]), *script_args]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{SCRIPTS[name]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    m = loadgen.machine()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.md"
    path.write_text(
        f"## {name}\n\nCommand: `{' '.join(command)}`  \nStarted "
        f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}; machine: nproc {m['nproc']}, CPU {m['cpu']}, "
        f"Python {m['python']}.\n\n{done.stdout}"
    )
    return path


def _at_least_one(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"at least 1, not {number}")
    return number


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=[*SCENARIOS, *SCRIPTS])
    p.add_argument("--concurrency", type=int, nargs="+", help="levels (default per scenario)")
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each point")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per point")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--name", help="file stem (default: the scenario)")
    p.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    p.add_argument(
        "--naiad-arg", action="append", default=[], help="extra naiad serve flag (--naiad-arg=--x=y)"
    )
    p.add_argument("--only", nargs="+", help="peers: only these servers (floor triton naiad mlserver kserve)")
    p.add_argument("--encoding", nargs="+", choices=[e[0] for e in ENCODINGS], help="peers: only these")
    p.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto")
    p.add_argument("--rounds", type=_at_least_one, default=1,
                   help="peers: run every server this many times, in a rotated order, and report each "
                   "point's median round")
    return p.parse_args(argv), extra


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = parse_args(argv)
    command = ["python", "-m", "bench.scenarios", *(sys.argv[1:] if argv is None else argv)]
    if args.scenario in SCRIPTS:
        if "--repository" not in extra:  # the bench repository's digits: no example build each time
            extra += ["--repository", str(ensure_repository(args.repository, ["digits"]))]
        print(run_script(args.scenario, extra, args.out, command).read_text())
        return 0
    repo = ensure_repository(args.repository)
    run = Run(args.scenario, args)
    extra_doc = SCENARIOS[args.scenario](run, repo)
    doc = loadgen.document(
        run.series,
        command,
        scenario=args.scenario,
        warmup_s=args.warmup,
        duration_s=args.duration,
        **extra_doc,
    )
    paths = report.write(doc, args.out, args.name or args.scenario, title=args.scenario)
    print(paths["md"].read_text())
    return 0 if all(p["requests"] and not p["errors"] for s in run.series for p in s["points"]) else 1


if __name__ == "__main__":
    sys.exit(main())
