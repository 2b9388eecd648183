"""A spinning framework thread at the normal policy and at SCHED_IDLE, in one server's run.

Starts ``naiad serve`` with ``--demote-spinning-threads false`` on the benchmark repository,
loads ``digits_python`` (``bench/peers/digits_python/model.py``: its ONNX Runtime session
spins, ONNX Runtime's default) at ``--concurrency`` without pause, and alternates windows of
``--window`` seconds: the worker's busiest thread (its ONNX Runtime pool thread, spinning) at
the normal policy, then at ``SCHED_IDLE`` throughout (:mod:`workers.spin_watch` moves it
there between batches only), then back, ``--rounds`` times. Each window reports the requests
answered a second (the model's statistics extension) and, per thread of the gateway, the worker and the load
generator, the share of the window it ran and the share it was runnable but waiting for a
CPU (``/proc/PID/task/TID/schedstat``: run ns, run-queue wait ns). One server, one load, so
the VM's drift (±40 % over minutes) moves both settings alike.

    .venv/bin/python -m bench.perf.spin_idle --rounds 4 --out bench/results/spin_idle.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import urllib.request
from pathlib import Path

from bench.perf import loadgen
from bench.perf.models import DEFAULT_REPOSITORY, ROOT, ensure_repository, target
from bench.perf.profile import server_processes
from bench.perf.servers import running, start_naiad

MODEL = "digits_python"


def schedstat(pid: int) -> dict[int, tuple[int, int]]:
    """Thread id -> (ns run, ns waiting on a run queue) of every thread of ``pid``."""
    found = {}
    for name in os.listdir(f"/proc/{pid}/task"):
        try:
            run, wait, _ = map(int, Path(f"/proc/{pid}/task/{name}/schedstat").read_text().split())
        except (OSError, ValueError):
            continue
        found[int(name)] = (run, wait)
    return found


def answered(http_url: str) -> tuple[int, int, int]:
    """The model's answered requests, executed batches and ``compute_infer`` ns so far
    (Triton's statistics extension: a request's ``compute_infer`` is its batch's, so the ns
    over the requests is the mean batch's compute time)."""
    with urllib.request.urlopen(f"http://{http_url.removeprefix('http://')}/v2/models/{MODEL}/stats") as r:
        stats = json.load(r)["model_stats"][0]
    inference = stats["inference_stats"]
    return inference["success"]["count"], stats["execution_count"], inference["compute_infer"]["ns"]


def window(http_url: str, pids: dict[str, int], seconds: float) -> dict:
    """One window: req/s, and per process its busiest thread's run and wait shares."""
    before = {k: schedstat(p) for k, p in pids.items()}
    first, start = answered(http_url), time.monotonic()
    time.sleep(seconds)
    count, batches, infer_ns = (b - a for a, b in zip(first, answered(http_url), strict=True))
    elapsed = time.monotonic() - start
    after = {k: schedstat(p) for k, p in pids.items()}
    shares = {}
    for kind, threads in after.items():
        for tid, (run, wait) in threads.items():
            if tid in before[kind]:
                run_s = (run - before[kind][tid][0]) / 1e9 / elapsed
                wait_s = (wait - before[kind][tid][1]) / 1e9 / elapsed
                if run_s > 0.05:
                    shares[f"{kind} {tid}"] = (round(run_s, 2), round(wait_s, 2))
    return {"rps": count / elapsed, "threads": shares, "batch": count / max(batches, 1),
            "infer_us": infer_ns / max(count, 1) / 1e3}  # each request counts its batch's time


def busiest(worker_pid: int, seconds: float = 1.0) -> int:
    """The worker's thread that ran most over ``seconds`` (under load: the spinning one)."""
    before = schedstat(worker_pid)
    time.sleep(seconds)
    after = schedstat(worker_pid)
    return max(after, key=lambda t: after[t][0] - before.get(t, (0, 0))[0])


def set_policy(tid: int, idle: bool) -> None:
    os.sched_setscheduler(tid, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))


def measure(args: argparse.Namespace) -> list[dict]:
    repo = ensure_repository(args.repository, [MODEL])
    logs = ROOT / ".bench" / "logs" / "spin_idle"
    server = start_naiad(repo, logs, [MODEL], extra_args=["--demote-spinning-threads", "false"])
    rows: list[dict] = []
    with running(server):
        tgt = target(server.http_url, MODEL, protocol="http", encoding=args.encoding)
        total_s = args.warmup + 2 * args.rounds * args.window + 4
        load = threading.Thread(target=lambda: loadgen.run(lambda: loadgen.measure(
            tgt, concurrency=[args.concurrency], warmup_s=args.warmup, duration_s=total_s)))  # fmt: skip
        load.start()
        time.sleep(args.warmup)
        procs = server_processes(server.pid)
        worker = next(p.pid for k, p in procs.items() if k.startswith("worker") and p.cpu_percent(0.5) > 5)
        pids = {"gateway": server.pid, "worker": worker, "loadgen": os.getpid()}
        spinner = busiest(worker)
        for rnd in range(args.rounds):
            for idle in (False, True) if rnd % 2 == 0 else (True, False):
                set_policy(spinner, idle)
                rows.append({"round": rnd + 1, "idle": idle, **window(server.http_url, pids, args.window)})
        set_policy(spinner, False)
        load.join()
    return rows


def render(rows: list[dict], command: str) -> str:
    def median(idle: bool, key) -> float:
        return statistics.median(key(r) for r in rows if r["idle"] is idle)

    def gateway(r: dict, i: int) -> float:
        return max((v for k, v in r["threads"].items() if k.startswith("gateway")), default=(0, 0))[i]

    lines = ["## A spinning ONNX Runtime pool thread: normal policy vs SCHED_IDLE\n",
             f"Command: `{command}` ({time.strftime('%Y-%m-%d %H:%M')}, "
             f"this machine: {os.cpu_count()} cores).\n",
             "| round | spinner | req/s | mean batch | compute_infer µs a batch "
             "| gateway thread run · run-queue wait (share of the window) "
             "| threads over 5 % of a core: run · wait |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        threads = ", ".join(f"{k} {v[0]:.2f} · {v[1]:.2f}" for k, v in r["threads"].items())
        lines.append(f"| {r['round']} | {'SCHED_IDLE' if r['idle'] else 'normal'} | {r['rps']:.0f} | "
                     f"{r.get('batch', 0):.1f} | {r.get('infer_us', 0):.0f} | "
                     f"{gateway(r, 0):.2f} · {gateway(r, 1):.2f} | {threads} |")  # fmt: skip
    ratio = median(True, lambda r: r["rps"]) / median(False, lambda r: r["rps"])
    waits = (median(False, lambda r: gateway(r, 1)), median(True, lambda r: gateway(r, 1)))
    lines += ["", f"Median req/s SCHED_IDLE / normal: **{ratio:.2f}×**; the gateway's run-queue wait, "
              f"median: {waits[0]:.2f} normal, {waits[1]:.2f} SCHED_IDLE."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--window", type=float, default=3.0, help="seconds per window")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--encoding", choices=["json", "binary"], default="json")
    p.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    command = "python -m bench.perf.spin_idle " + " ".join(argv if argv is not None else os.sys.argv[1:])
    text = render(measure(args), command.strip())
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
