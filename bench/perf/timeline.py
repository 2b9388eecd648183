"""A c1 request's critical path, stage by stage: wall time between marks in the client, the
gateway and the worker.

Starts ``naiad serve`` on the benchmark repository with :mod:`bench.perf.timeline_hook` first
on its ``PYTHONPATH`` (so every Naiad process loads its ``sitecustomize``), loads ``--model``
at concurrency 1 over HTTP (:mod:`bench.perf.loadgen`, its own keep-alive client) until the
worker is up and warm, then has each process mark each call of the functions of
:data:`TARGETS` (wrapped as their modules are imported) at its start and end
(``time.perf_counter_ns``: ``CLOCK_MONOTONIC``, one clock across the machine's processes)
for ``--duration`` seconds, the load generator marking each request written and each
answer's first bytes read. The marks are merged in time order and cut into
cycles at each request written; over the cycles that pass the most common sequence of marks
(a request that took another way, through Redis, or a flush of statistics in between, is left
out), it prints each step's p50 and mean (µs) and the request's p50 from written to read.

Each mark costs its process ~1 µs (a wrapper call, a clock read, a list append): the figures
are those of a slightly slower server, read as shares. Steps between marks of two processes
include a process wake-up.

    .venv/bin/python -m bench.perf.timeline --model digits --encoding json --duration 4
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from bench.perf import loadgen
from bench.perf.models import BUILDERS, DEFAULT_REPOSITORY, ROOT, ensure_repository, target
from bench.perf.servers import running, start_naiad

HOOK = Path(__file__).parent / "timeline_hook"
#: The functions marked, in the order a c1 request meets them: the gateway's HTTP front and
#: JSON parse, the data plane, the hand-off to the worker, the worker's receipt, batch and
#: model run, its reply, the gateway's receipt, rendering and answer.
TARGETS = (
    "gateway.http_fast:FastFront.data_received",
    "gateway.http:parse_infer_request",
    "gateway.dataplane:DataPlane.infer",
    "naiad.queue_client:QueueDispatcher._fields",
    "naiad.reply_channel:WorkerLink._write_now",
    "naiad.reply_channel:GatewayLink.data_received",
    "workers.worker:Worker._process",
    "workers.execution:BatchExecutor.execute",
    "workers.backends.onnxruntime:OnnxRuntimeBackend.infer",
    "workers.backends.python:PythonBackend.execute_requests",
    "naiad.reply_channel:ReplyConnections.send",
    "naiad.reply_channel:WorkerLink.data_received",
    "gateway.http:render_infer_response",
    "gateway.http_fast:answer_head",
)
SENT, READ = "client: request written", "client: answer read"
#: Below this share of cycles on the most common sequence, the steps describe few requests
#: (on a busy machine the processes' marks interleave in more orders): said in the output.
MIN_KEPT = 0.9


def mark_client(marks: list[tuple[str, int]], enabled: list[bool]) -> None:
    """Mark each request the load generator writes and each first read of its answer."""
    request, received = loadgen.HttpConnection.request, loadgen.HttpConnection.data_received

    def marked_request(self, raw):
        if enabled[0]:
            marks.append((SENT, time.perf_counter_ns()))
        return request(self, raw)

    def marked_received(self, data):
        if enabled[0] and self._waiter is not None:
            marks.append((READ, time.perf_counter_ns()))
        return received(self, data)

    loadgen.HttpConnection.request = marked_request
    loadgen.HttpConnection.data_received = marked_received


Cycle = list[tuple[int, str]]


def _cycles(marks: list[tuple[str, int]]) -> tuple[tuple[str, ...], list[Cycle], int]:
    """``marks`` (every process's, any order) cut into cycles at each request written: the
    most common sequence of names, the cycles that took it, and how many cycles there were."""
    cycles: list[Cycle] = []
    for ns, name in sorted((ns, name) for name, ns in marks):
        if name == SENT:
            cycles.append([])
        if cycles:
            cycles[-1].append((ns, name))
    if not cycles:
        raise SystemExit("no request was marked")
    common = collections.Counter(tuple(n for _, n in c) for c in cycles).most_common(1)[0][0]
    return common, [c for c in cycles if tuple(n for _, n in c) == common], len(cycles)


def _total_us(common: tuple[str, ...], cycle: Cycle) -> float:
    """A cycle's request written → answer read (µs; to its last mark without a read)."""
    read = common.index(READ) if READ in common else len(common) - 1
    return (cycle[read][0] - cycle[0][0]) / 1e3


def steps(marks: list[tuple[str, int]]) -> tuple[list[tuple[str, str, float, float]], float, int, int]:
    """``marks`` (every process's, any order) as cycles from each request written: the most
    common sequence's steps ``(from, to, p50 µs, mean µs)``, its p50 written → read (µs), the
    cycles of that sequence and all cycles."""
    common, kept, cycles = _cycles(marks)
    rows = []
    for i, (first, second) in enumerate(zip(common, common[1:], strict=False)):
        gaps = [(c[i + 1][0] - c[i][0]) / 1e3 for c in kept]
        rows.append((first, second, statistics.median(gaps), statistics.mean(gaps)))
    total = statistics.median(_total_us(common, c) for c in kept)
    return rows, total, len(kept), cycles


def quarters(marks: list[tuple[str, int]]) -> tuple[list[tuple[str, str, float, float]], float, float]:
    """The fastest and the slowest quarter of the common sequence's cycles (by written →
    read) side by side: each step's mean µs in either ``(from, to, fast, slow)``, and the
    two quarters' median written → read (µs). Where the slow requests lose their time: a
    step or two (a path, a timer), or all of them (the machine's state that cycle)."""
    common, kept, _ = _cycles(marks)
    kept.sort(key=lambda c: _total_us(common, c))
    size = max(len(kept) // 4, 1)
    fast, slow = kept[:size], kept[-size:]
    rows = []
    for i, (first, second) in enumerate(zip(common, common[1:], strict=False)):
        means = [statistics.mean((c[i + 1][0] - c[i][0]) / 1e3 for c in part) for part in (fast, slow)]
        rows.append((first, second, means[0], means[1]))
    medians = [statistics.median(_total_us(common, c) for c in part) for part in (fast, slow)]
    return rows, medians[0], medians[1]


def collect(folder: Path, timeout_s: float = 10.0) -> list[tuple[str, int]]:
    """The marks of every process under ``folder`` (``marks-PID.json``: :func:`written`)."""
    files = written(folder, "marks", timeout_s)
    return [(name, ns) for path in files for name, ns in json.loads(path.read_text())]


def written(folder: Path, prefix: str, timeout_s: float = 10.0) -> list[Path]:
    """The ``<prefix>-PID.json`` files of the processes under ``folder`` (each written whole
    by its hook: a temporary file renamed), once no new one came for half a second (at most
    ``timeout_s``)."""
    deadline, seen, settled_at = time.monotonic() + timeout_s, -1, time.monotonic()
    while time.monotonic() < deadline:
        files = sorted(folder.glob(f"{prefix}-*.json"))
        if len(files) != seen:
            seen, settled_at = len(files), time.monotonic()
        elif files and time.monotonic() - settled_at >= 0.5:
            break
        time.sleep(0.05)
    return sorted(folder.glob(f"{prefix}-*.json"))


def hooked_run(
    parser: argparse.ArgumentParser, model: str, repository: Path, name: str, files: str
) -> tuple[Path, str, Path]:  # fmt: skip
    """What a tool whose ``naiad serve`` runs :data:`HOOK` needs: ``.bench/logs/<name>``
    emptied, with its ``files`` folder made; the ``PYTHONPATH`` with the hook first; the
    benchmark repository holding ``model`` (built when it is one of the benchmark's). An
    unknown model is the parser's error."""
    if model not in BUILDERS and not (repository / model / "config.pbtxt").exists():
        parser.error(f"no model '{model}' in {repository} (the benchmark's: {', '.join(BUILDERS)})")
    folder = ROOT / ".bench" / "logs" / name
    shutil.rmtree(folder, ignore_errors=True)
    (folder / files).mkdir(parents=True)
    path = os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")]))
    return folder, path, ensure_repository(repository, [model] if model in BUILDERS else [])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--model", default="digits", help="a model of the benchmark repository")
    p.add_argument("--encoding", choices=["json", "binary"], default="json", help="HTTP body")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of load before the marks")
    p.add_argument("--duration", type=float, default=4.0, help="seconds of load marked")
    p.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    p.add_argument("--quarters", action="store_true",
                   help="also each step's mean in the fastest and the slowest quarter of the requests")
    args = p.parse_args(argv)
    folder, path, repository = hooked_run(p, args.model, args.repository, "timeline", "marks")
    env = {"NAIAD_TIMELINE_DIR": str(folder / "marks"), "NAIAD_TIMELINE_TARGETS": ",".join(TARGETS),
           "PYTHONPATH": path}  # fmt: skip
    marks: list[tuple[str, int]] = []
    enabled = [False]
    mark_client(marks, enabled)
    server = start_naiad(repository, folder, [args.model], env=env)
    with running(server):
        tgt = target(server.http_url, args.model, protocol="http", encoding=args.encoding)
        loadgen.run(lambda: loadgen.measure(tgt, concurrency=[1], warmup_s=args.warmup, duration_s=0.5))
        (folder / "marks" / "on").touch()
        time.sleep(0.2)  # each process's watcher looks every 20 ms
        enabled[0] = True
        series = loadgen.run(
            lambda: loadgen.measure(tgt, concurrency=[1], warmup_s=0.2, duration_s=args.duration)
        )
        enabled[0] = False
        (folder / "marks" / "off").touch()
        marks += collect(folder / "marks")
    rows, total, kept, cycles = steps(marks)
    point = series["points"][0]
    print(f"`python -m bench.perf.timeline {' '.join(sys.argv[1:] if argv is None else argv)}`: "
          f"{point['throughput_rps']:.0f} req/s, p50 {point['latency_ms']['p50']:.3f} ms (the load "
          f"generator's count, marks included); {kept} of {cycles} cycles in the most common "
          f"sequence, p50 written → read {total:.0f} µs\n")  # fmt: skip
    if kept < MIN_KEPT * cycles:
        print(f"**Only {kept / cycles:.0%} of the cycles took the common sequence**: the machine was "
              "busy (the processes' marks interleaved in other orders); run it on a quiet machine.\n")
    print("| from | to | p50 µs | mean µs |\n| --- | --- | --- | --- |")
    for first, second, p50, mean in rows:
        print(f"| {first} | {second} | {p50:.1f} | {mean:.1f} |")
    if args.quarters:
        split, fast, slow = quarters(marks)
        print(f"\nThe fastest and the slowest quarter of those requests (written → read p50 {fast:.0f} and "
              f"{slow:.0f} µs), each step's mean:\n\n| from | to | fastest µs | slowest µs | difference |\n"
              "| --- | --- | --- | --- | --- |")  # fmt: skip
        for first, second, quick, late in split:
            print(f"| {first} | {second} | {quick:.1f} | {late:.1f} | {late - quick:+.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
