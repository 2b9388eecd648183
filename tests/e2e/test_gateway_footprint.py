"""The gateway and the scaler never import torch, tensorflow or onnxruntime, and the gateway
stays small while it serves.

A real ``naiad gateway`` and a real ``naiad scaler`` (separate processes, one private Redis)
serve the digits model; then each process's ``/proc/<pid>/maps`` is read: importing any of
those frameworks maps its native library (``onnxruntime_pybind11_state*.so``,
``libtorch*.so``, ``libtensorflow*.so``) into the process, and nothing unmaps it. The
worker that served the requests maps ``onnxruntime``: the check sees an import where there
is one. The gateway's resident memory (RSS now, and its peak ``VmHWM``) is measured after
it served :data:`REQUESTS` requests (docs/architecture.md, "Gateway footprint").
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import tritonclient.http as httpclient
from naiad_harness import ROOT, start_server

from naiad import procs

FRAMEWORKS = ("onnxruntime", "libtorch", "torch/lib", "tensorflow")
REQUESTS = 2000
#: The gateway's RSS bound (MiB): about 3x what it measures here, far below any framework.
MAX_GATEWAY_RSS_MIB = 250


def mapped_files(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as maps:
        return {line.split(maxsplit=5)[5].strip() for line in maps if len(line.split(maxsplit=5)) == 6}


def frameworks_in(pid: int) -> list[str]:
    return sorted(path for path in mapped_files(pid) if any(name in path for name in FRAMEWORKS))


def peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def serve(url: str, rows: np.ndarray) -> None:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    try:
        for row in rows:
            tensor = httpclient.InferInput("input", [1, 64], "FP32")
            tensor.set_data_from_numpy(row[np.newaxis])
            client.infer("digits", [tensor], outputs=[httpclient.InferRequestedOutput("label")])
    finally:
        client.close()


def test_gateway_and_scaler_import_no_framework_and_the_gateway_stays_small(
    example_repository: Path, redis_url: str, digits_holdout, tmp_path: Path
):
    gateway = start_server(example_repository, tmp_path / "gw", command="gateway", redis_url=redis_url)
    scaler = procs.spawn_python([
        sys.executable, "-m", "naiad_cli", "scaler", "--model-repository", str(example_repository),
        "--redis-url", redis_url, "--cache-dir", str(gateway.cache_dir), "--warm-pool-size", "0",
    ], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        idle = psutil.Process(gateway.process.pid).memory_info().rss
        rows = np.resize(digits_holdout[0], (REQUESTS // 4, 64))
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for done in [pool.submit(serve, gateway.url, rows) for _ in range(4)]:
                done.result()
        [worker] = gateway.worker_processes("digits")
        assert any("onnxruntime" in path for path in mapped_files(worker.pid))  # the check sees imports
        assert frameworks_in(gateway.process.pid) == []
        assert frameworks_in(scaler.pid) == []
        rss = psutil.Process(gateway.process.pid).memory_info().rss
        peak = peak_rss_bytes(gateway.process.pid)
        worker_rss = worker.memory_info().rss
        mib = {"idle": idle, "now": rss, "peak": peak, "worker": worker_rss,
               "scaler": psutil.Process(scaler.pid).memory_info().rss}
        print("\nRSS MiB after", REQUESTS, "requests:", {k: round(v / 2**20) for k, v in mib.items()})
        assert peak < MAX_GATEWAY_RSS_MIB * 2**20
    finally:
        procs.stop(scaler)  # SIGTERM: it stops its workers first
        gateway.stop()
