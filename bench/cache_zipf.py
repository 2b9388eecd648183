"""Response-cache benchmark: Zipf-distributed repeated queries, cache on and off, one run.

Starts its own ``naiad serve`` (embedded Redis, free ports) on a copy of the example
repository holding ``digits`` (no cache) and ``digits_cached`` (the same model with
``response_cache { enable: true }``), sends the same request sequence to each — ``--requests``
draws over ``--distinct`` held-out digits, rank ``r`` with probability ∝ 1 / r**``--zipf-s``,
``--concurrency`` in flight through ``tritonclient.http.aio`` — and prints a Markdown table:
hit ratio (from the statistics extension), p50/p99 latency of hits and misses (client side; a
request is a "miss" the first time its input is sent, later ones are hits, coalesced followers
included), throughput. Cold starts are excluded (one warm-up request per model first).

    .venv/bin/python bench/cache_zipf.py [--repository BUILT_REPO] [--requests 3000] ...
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import requests
import tritonclient.http.aio as aiohttpclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_repository(source: Path | None, workdir: Path) -> Path:
    """A repository with ``digits`` and ``digits_cached`` under ``workdir``."""
    repo = workdir / "models"
    if source is None:
        subprocess.run([sys.executable, str(ROOT / "examples" / "build_repository.py"), str(repo)],
                       check=True, capture_output=True)  # fmt: skip
    else:
        shutil.copytree(source / "digits", repo / "digits")
    shutil.rmtree(repo / "silero_vad", ignore_errors=True)
    shutil.copytree(repo / "digits", repo / "digits_cached")
    config = repo / "digits_cached" / "config.pbtxt"
    text = config.read_text().replace('name: "digits"', 'name: "digits_cached"')
    config.write_text(text + "response_cache { enable: true }\n")
    return repo


def start_server(repo: Path, workdir: Path) -> tuple[subprocess.Popen, int]:
    """``naiad serve`` on free ports; returns the process and its HTTP port once ready."""
    process, http, _ = start_serve(repo, workdir)
    return process, http


def start_serve(repo: Path, workdir: Path) -> tuple[subprocess.Popen, int, int]:
    """``naiad serve`` on free ports; the process, its HTTP and gRPC ports once ready."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    args = [sys.executable, "-m", "naiad_cli", "serve", "--model-repository", str(repo),
            "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
            "--cache-dir", str(workdir / "cache"), "--log-level", "WARNING"]  # fmt: skip
    log = (workdir / "serve.log").open("wb")
    process = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1).ok:
                return process, http, grpc
        except requests.ConnectionError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("naiad serve did not become ready")


def zipf_sequence(distinct: int, count: int, s: float, seed: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, distinct + 1) ** s
    return np.random.default_rng(seed).choice(distinct, size=count, p=weights / weights.sum())


async def run_model(url: str, model: str, xs: np.ndarray, order: np.ndarray, concurrency: int) -> dict:
    """Send ``xs[order]`` to ``model``; latencies (s) split into first sends and repeats."""
    client = aiohttpclient.InferenceServerClient(url, conn_limit=concurrency)
    seen: set[int] = set()
    hits: list[float] = []
    misses: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in order:
        queue.put_nowait(int(index))

    async def one(x: np.ndarray) -> float:
        tensor = aiohttpclient.InferInput("input", [1, 64], "FP32")
        tensor.set_data_from_numpy(x[None, :])
        started = time.perf_counter()
        await client.infer(model, [tensor], outputs=[aiohttpclient.InferRequestedOutput("label")])
        return time.perf_counter() - started

    async def sender() -> None:
        while not queue.empty():
            index = queue.get_nowait()
            first = index not in seen
            seen.add(index)
            (misses if first else hits).append(await one(xs[index]))

    try:
        await one(np.full(64, 16, np.float32))  # warm-up: the cold start stays out of the figures
        before = (await client.get_inference_statistics(model, "1"))["model_stats"][0]["inference_stats"]
        started = time.perf_counter()
        await asyncio.gather(*[sender() for _ in range(concurrency)])
        elapsed = time.perf_counter() - started
        after = (await client.get_inference_statistics(model, "1"))["model_stats"][0]["inference_stats"]
    finally:
        await client.close()
    server_hits = after["cache_hit"]["count"] - before["cache_hit"]["count"]
    server_misses = after["cache_miss"]["count"] - before["cache_miss"]["count"]
    looked_up = server_hits + server_misses
    return {"model": model, "hits": hits, "misses": misses, "elapsed": elapsed, "requests": len(order),
            "hit_ratio": server_hits / looked_up if looked_up else 0.0}  # fmt: skip


def ms(values: list[float], q: float) -> str:
    return f"{np.percentile(values, q) * 1000:.2f}" if values else "–"


def table(results: list[dict]) -> str:
    lines = [
        "| model | cache | requests | hit ratio | repeat p50 ms | repeat p99 ms | first p50 ms "
        "| first p99 ms | req/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        cache = "on" if r["model"].endswith("_cached") else "off"
        lines.append(
            f"| {r['model']} | {cache} | {r['requests']} | {r['hit_ratio']:.3f} | {ms(r['hits'], 50)} | "
            f"{ms(r['hits'], 99)} | {ms(r['misses'], 50)} | {ms(r['misses'], 99)} | "
            f"{r['requests'] / r['elapsed']:.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, help="an example repository already built")
    parser.add_argument("--requests", type=int, default=3000, help="requests per model")
    parser.add_argument("--distinct", type=int, default=200, help="distinct inputs (≤ 360)")
    parser.add_argument("--zipf-s", type=float, default=1.1, help="Zipf exponent")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from digits_data import load_holdout  # noqa: PLC0415 - examples/ is on the path now

    xs = load_holdout()[0][: args.distinct]
    order = zipf_sequence(len(xs), args.requests, args.zipf_s, args.seed)
    with tempfile.TemporaryDirectory(prefix="naiad-bench-") as tmp:
        workdir = Path(tmp)
        process, port = start_server(build_repository(args.repository, workdir), workdir)
        try:
            url = f"127.0.0.1:{port}"
            results = [asyncio.run(run_model(url, m, xs, order, args.concurrency))
                       for m in ("digits", "digits_cached")]  # fmt: skip
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(30)
    print(f"{args.requests} requests per model over {len(xs)} distinct digits, Zipf s={args.zipf_s}, "
          f"concurrency {args.concurrency}, {os.cpu_count()} CPUs\n")  # fmt: skip
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
