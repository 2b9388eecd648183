"""Where Naiad's time goes under load: py-spy on the gateway and each worker, CPU per process.

Starts ``naiad serve`` on the benchmark repository, loads ``--model`` at ``--concurrency``
(HTTP, binary tensors, :mod:`bench.perf.loadgen`) until the workers are up and warm, then for
``--duration`` seconds records every Python process of the server with ``py-spy record
--nonblocking`` (sampling without pausing the process, ``--rate`` Hz) while measuring the load
and each process's and thread's CPU (gateway, redis-server, workers). Writes under ``--out``:
``PROCESS.txt`` collapsed stacks (open them in speedscope or flamegraph.pl) and ``profile.md``: the CPU split
and, per process, the top functions by *self* samples (on top of the stack) and Naiad's own
functions by *inclusive* samples (anywhere on the stack), as shares of that process's samples.
``--blocking`` pauses each process per sample instead (slower, but whole stacks: without it,
63 % of a c1 worker's samples had only ``Runner.run`` on its stack while ``perf`` put 55 % of its
CPU in the interpreter; docs/benchmarks.md, "Stop 26"). Blocking samples include threads
waiting in C (a model thread's queue, the event loop's ``epoll_wait``): leave those out.

    .venv/bin/python -m bench.perf.profile --model digits --concurrency 32 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bench.perf import loadgen
from bench.perf.models import DEFAULT_REPOSITORY, ROOT, ensure_repository, target
from bench.perf.servers import running, start_naiad


def server_processes(serve_pid: int) -> dict[str, psutil.Process]:
    """``gateway`` (the ``naiad serve`` process), ``gateway-PID`` for each sibling gateway process
    (``naiad_cli gateway``, ``gateway/siblings.py``), ``redis``, ``worker-PID`` for each worker."""
    root = psutil.Process(serve_pid)
    found = {"gateway": root}
    for child in root.children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "redis-server" in cmd or child.name().startswith("redis"):
            found["redis"] = child
        elif "naiad_cli gateway" in cmd:
            found[f"gateway-{child.pid}"] = child
        elif "worker" in cmd:
            found[f"worker-{child.pid}"] = child
    return found


def cpu_seconds(proc: psutil.Process) -> float:
    try:
        t = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system


PROJECT = ("naiad/", "gateway/", "workers/", "repository_store/")


def thread_seconds(proc: psutil.Process) -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of each thread of ``proc`` by thread id, with the thread's
    name (Linux ``/proc/PID/task/TID/comm``; ``?`` where it cannot be read)."""
    try:
        threads = proc.threads()
    except psutil.Error:
        return {}
    found = {}
    for thread in threads:
        try:
            name = Path(f"/proc/{proc.pid}/task/{thread.id}/comm").read_text().strip()
        except OSError:
            name = "?"
        found[thread.id] = (name, thread.user_time + thread.system_time)
    return found


def thread_costs(
    before: dict, after: dict, requests: int, wall_s: float
) -> list[tuple[str, str, float, float]]:
    """``(process, thread, µs a request, cores)`` of every thread that used at least 1 % of a
    core between two :func:`thread_seconds` snapshots per process, busiest first."""
    rows = []
    for process, threads in after.items():
        for tid, (name, seconds) in threads.items():
            used = seconds - before.get(process, {}).get(tid, (name, 0.0))[1]
            if used / wall_s >= 0.01:
                rows.append((process, f"{name} ({tid})", 1e6 * used / max(requests, 1), used / wall_s))
    return sorted(rows, key=lambda row: -row[3])


def top_frames(collapsed: Path, count: int = 10) -> tuple[int, list, list]:
    """From py-spy's raw (collapsed) stacks: (samples, top functions by self samples, top
    *project* functions — Naiad's own modules — by inclusive samples). Line numbers are dropped,
    so a function counts once whatever line it was on."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames, samples = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")], int(n)
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            if frame.rpartition("(")[2].startswith(PROJECT):
                inclusive[frame] += samples
    return total, own.most_common(count), inclusive.most_common(count)


def spy(
    pid: int, out: Path, name: str, duration_s: float, rate: int, blocking: bool = False
) -> subprocess.Popen:
    """``py-spy record`` of ``pid`` into ``out/NAME.txt`` (collapsed stacks: speedscope, flamegraph.pl)."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    args = [
        py_spy,
        "record",
        *([] if blocking else ["--nonblocking"]),
        "-r",
        str(rate),
        "-d",
        str(int(duration_s)),
        "-p",
        str(pid),
        "-f",
        "raw",
        "-o",
        str(out / f"{name}.txt"),
    ]
    log = (out / f"{name}.log").open("wb")
    return subprocess.Popen(args, stdout=log, stderr=log)


async def profile(server, args) -> dict:
    url = server.grpc_url if args.protocol == "grpc" else server.http_url
    tgt = target(url, args.model, protocol=args.protocol, encoding=args.encoding)
    client = loadgen.make_client(tgt)
    try:
        await loadgen.probe(client, tgt, 60)
        await loadgen.closed_loop(client.send, args.concurrency, args.warmup, 0.5)  # scale up, warm up
        procs = server_processes(server.pid)
        spies = [spy(proc.pid, args.out, name, args.duration, args.rate, args.blocking)
                 for name, proc in procs.items() if name != "redis"]  # fmt: skip
        await asyncio.sleep(1.0)  # py-spy attaches
        before = {name: cpu_seconds(proc) for name, proc in procs.items()}
        threads_before = {name: thread_seconds(proc) for name, proc in procs.items()}
        started = time.perf_counter()
        point = await loadgen.closed_loop(client.send, args.concurrency, 0.0, args.duration - 2.0)
        wall = time.perf_counter() - started
        cpu = {name: (cpu_seconds(proc) - before[name]) / wall for name, proc in procs.items()}
        threads_after = {name: thread_seconds(proc) for name, proc in procs.items()}
    finally:
        await client.close()
    for proc in spies:
        proc.wait(60)
    requests = round(point["throughput_rps"] * wall)
    threads = thread_costs(threads_before, threads_after, requests, wall)
    return {"point": point, "cpu": cpu, "processes": list(procs), "threads": threads}


def render(result: dict, args) -> str:
    p, command = result["point"], " ".join(["python", "-m", "bench.perf.profile", *sys.argv[1:]])
    lines = [
        f"## Profile: {args.model} at concurrency {args.concurrency}",
        "",
        f"`{command}`: {p['throughput_rps']:.0f} req/s, p50 {p['latency_ms']['p50']} ms, "
        f"p99 {p['latency_ms']['p99']} ms; load generator {p['client_cpu']:.2f} cores.",
        "",
        "CPU (cores) per process: " + ", ".join(f"{n} {v:.2f}" for n, v in result["cpu"].items()),
        "",
        "CPU per thread (`/proc/PID/task`; threads over 1 % of a core):",
        "",
        "| process | thread | µs a request | cores |",
        "| --- | --- | --- | --- |",
        *(f"| {p} | {t} | {us:.1f} | {cores:.2f} |" for p, t, us, cores in result["threads"]),
        "",
    ]
    for name in result["processes"]:
        path = args.out / f"{name}.txt"
        if name == "redis" or not path.exists():
            continue
        total, own, inclusive = top_frames(path, args.top)
        if not total:  # an idle warm-pool process
            continue
        lines += [
            f"### {name} ({total} samples, {name}.txt)",
            "",
            "| self % | function | | incl % | Naiad function |",
        ]
        lines.append("| --- | --- | --- | --- | --- |")
        for (f1, n1), (f2, n2) in zip(own, inclusive, strict=False):
            lines.append(f"| {100 * n1 / total:.1f} | `{f1}` | | {100 * n2 / total:.1f} | `{f2}` |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="digits")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--encoding", choices=["binary", "json"], default="binary", help="HTTP body")
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=12.0, help="py-spy seconds (load: 2 s less)")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--blocking", action="store_true", help="pause each process per sample (module doc)")
    parser.add_argument("--naiad-arg", action="append", default=[])
    parser.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "profile")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    repo = ensure_repository(args.repository)
    with running(start_naiad(repo, args.out, [args.model], args.naiad_arg)) as server:
        result = loadgen.run(lambda: profile(server, args))
    text = render(result, args)
    (args.out / "profile.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
