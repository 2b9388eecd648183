"""Repository scale: 1 model vs 1,000 models in an S3 bucket (moto's server over HTTP), all
at zero workers. Measures, for each size:

- the start-up index (``naiad serve`` launch to ``/v2/health/ready``);
- the gateway process's RSS (psutil; the ``naiad serve`` process, gateway and local scaler in
  one, without its children: the embedded redis-server and workers) right after start and
  after several poll periods;
- one poll with no change (in this process: a ``ModelRegistry`` on the same bucket and a
  private Redis, :meth:`ModelRegistry.poll`, median of ``--polls``), next to what a full
  re-index (``index_repository``, what a poll cost before fingerprints) takes;
- the cold start of ``digits`` (request to answer, model at zero workers), p50 and max of
  ``--cold-starts`` runs, waiting for the worker to exit (``--idle-timeout 1``) between them.

The 999 extra models are copies of ``digits`` (server-side ``copy_object`` of its files,
a fresh config for each name), made by a thread pool. Run from the repository root:

    .venv/bin/python bench/repository_scale.py
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import numpy as np
import psutil
import requests
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.registry import ModelRegistry  # noqa: E402
from naiad.redis_client import connect  # noqa: E402
from naiad.redis_server import EmbeddedRedis  # noqa: E402
from repository_store import S3Store, index_repository  # noqa: E402

S3_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
PREFIX = "models"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition, timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(interval_s)


def start_moto(workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"

    def up() -> bool:  # moto loads its backends on its first request: seconds on 2 cores
        try:
            requests.get(endpoint, timeout=(1.0, 10.0))
            return True
        except (requests.ConnectionError, requests.Timeout):
            return False

    wait_until(up, 30, "moto")
    return process, endpoint


def fill_bucket(endpoint: str, digits: Path, models: int) -> str:
    """A new bucket with ``digits`` and ``models - 1`` copies; returns its name."""
    bucket = f"scale-{models}-{uuid.uuid4().hex[:8]}"
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    files = ["1/model.onnx", "labels.txt"]
    for rel in [*files, "config.pbtxt"]:
        client.upload_file(str(digits / rel), bucket, f"{PREFIX}/digits/{rel}")
    config = (digits / "config.pbtxt").read_text()

    def copy(index: int) -> None:
        name = f"digits_{index:04d}"
        for rel in files:
            client.copy_object(Bucket=bucket, Key=f"{PREFIX}/{name}/{rel}",
                               CopySource={"Bucket": bucket, "Key": f"{PREFIX}/digits/{rel}"})
        body = config.replace('name: "digits"', f'name: "{name}"').encode()
        client.put_object(Bucket=bucket, Key=f"{PREFIX}/{name}/config.pbtxt", Body=body)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(copy, range(1, models)))
    return bucket


def start_server(uri: str, workdir: Path, poll_s: float) -> tuple[subprocess.Popen, int, int, float]:
    http, grpc, metrics = free_port(), free_port(), free_port()
    args = [sys.executable, "-m", "naiad_cli", "serve", "--model-repository", uri,
            "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
            "--cache-dir", str(workdir / "cache"), "--log-level", "WARNING", "--idle-timeout", "1",
            "--model-control-mode", "poll", "--repository-poll-secs", str(poll_s)]  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    log = (workdir / "serve.log").open("wb")
    started = time.perf_counter()
    process = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def ready() -> bool:
        if process.poll() is not None:
            raise SystemExit(f"naiad serve exited; see {workdir / 'serve.log'}")
        try:
            return requests.get(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1).ok
        except requests.ConnectionError:
            return False

    wait_until(ready, 600, "naiad serve ready", 0.1)
    return process, http, metrics, time.perf_counter() - started


def workers(metrics_port: int) -> float:
    text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    match = re.search(r'^naiad_model_workers\{model="digits"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def cold_starts(http: int, metrics_port: int, runs: int) -> list[float]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http}", network_timeout=120)
    tensor = httpclient.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 64), np.float32))
    times = []
    try:
        for _ in range(runs):
            wait_until(lambda: workers(metrics_port) == 0, 60, "digits back at zero", 0.2)
            started = time.perf_counter()
            client.infer("digits", [tensor])
            times.append(time.perf_counter() - started)
    finally:
        client.close()
    return times


async def poll_times(uri_bucket: str, endpoint: str, polls: int) -> tuple[float, float]:
    """Median seconds of a no-change poll and of a full re-index, on a private Redis."""
    store = S3Store(uri_bucket, PREFIX, endpoint)
    with EmbeddedRedis() as server:
        redis = connect(server.url)
        try:
            registry = ModelRegistry(redis, store)
            await registry.start("poll", [])
            polled = []
            for _ in range(polls):
                started = time.perf_counter()
                changed = await registry.poll()
                polled.append(time.perf_counter() - started)
                assert not changed and registry.last_poll_indexed == []
        finally:
            await redis.aclose()
    full = []
    for _ in range(max(1, polls // 2)):
        started = time.perf_counter()
        index_repository(store)
        full.append(time.perf_counter() - started)
    return statistics.median(polled), statistics.median(full)


def measure(endpoint: str, digits: Path, models: int, args, workdir: Path) -> dict:
    setup = time.perf_counter()
    bucket = fill_bucket(endpoint, digits, models)
    setup = time.perf_counter() - setup
    uri = f"s3://{endpoint.removeprefix('http://')}/{bucket}/{PREFIX}"
    process, http, metrics_port, start_s = start_server(uri, workdir / str(models), args.poll_secs)
    try:
        gateway = psutil.Process(process.pid)
        rss_start = gateway.memory_info().rss
        time.sleep(args.poll_secs * args.settle_polls)
        rss_polled = gateway.memory_info().rss
        colds = cold_starts(http, metrics_port, args.cold_starts)
        rss_after = gateway.memory_info().rss
    finally:
        process.terminate()
        process.wait(30)
    poll_s, full_s = asyncio.run(poll_times(bucket, endpoint, args.polls))
    return {"models": models, "setup_s": setup, "start_s": start_s, "rss_start": rss_start,
            "rss_polled": rss_polled, "rss_after": rss_after, "poll_s": poll_s, "full_s": full_s,
            "cold_p50": statistics.median(colds), "cold_max": max(colds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, help="a built example repository (default: build one)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 1000])
    parser.add_argument("--poll-secs", type=float, default=2.0)
    parser.add_argument("--settle-polls", type=int, default=5, help="poll periods before the 2nd RSS reading")
    parser.add_argument("--polls", type=int, default=5)
    parser.add_argument("--cold-starts", type=int, default=5)
    args = parser.parse_args()
    import os  # noqa: PLC0415

    os.environ.update(S3_ENV)
    with tempfile.TemporaryDirectory(prefix="naiad-scale-") as tmp:
        workdir = Path(tmp)
        if args.repository is None:
            subprocess.run([sys.executable, str(ROOT / "examples" / "build_repository.py"),
                            str(workdir / "src")], check=True, capture_output=True)
            digits = workdir / "src" / "digits"
        else:
            digits = args.repository / "digits"
        moto, endpoint = start_moto(workdir)
        try:
            rows = [measure(endpoint, digits, size, args, workdir) for size in args.sizes]
        finally:
            moto.terminate()
            moto.wait(10)
        shutil.rmtree(workdir / "src", ignore_errors=True)
    mib = 1024 * 1024
    print("| models | bucket setup s | start to ready s | RSS after start MiB | RSS after polls MiB "
          "| RSS after cold starts MiB | no-change poll ms | full re-index ms | cold start p50 ms "
          "| cold start max ms |")
    print("| --- " * 10 + "|")
    for r in rows:
        print(f"| {r['models']} | {r['setup_s']:.1f} | {r['start_s']:.2f} | {r['rss_start'] / mib:.1f} "
              f"| {r['rss_polled'] / mib:.1f} | {r['rss_after'] / mib:.1f} | {r['poll_s'] * 1000:.1f} "
              f"| {r['full_s'] * 1000:.1f} | {r['cold_p50'] * 1000:.0f} | {r['cold_max'] * 1000:.0f} |")


if __name__ == "__main__":
    main()
