"""System shared memory against tensors in the request: one run, one table.

Starts its own ``naiad serve`` on a copy of the example ``digits`` with ``max_batch_size``
raised to 16384, then, for each size, sends ``--requests`` sequential requests of ROWS x 64
FP32 over HTTP (binary tensors) and gRPC (raw contents), once with the tensors in the request
and response and once with the input and the ``probabilities`` output in a region made with
``tritonclient.utils.shared_memory`` (the output read back from it), and prints the median
latency (client side, two warm-up requests first).

    .venv/bin/python bench/shared_memory.py [--rows 64 4096 16384] [--requests 50]
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cache_zipf import ROOT, start_serve  # noqa: E402

MAX_ROWS = 16384


def build_repository(workdir: Path) -> Path:
    repo = workdir / "models"
    build = [sys.executable, str(ROOT / "examples" / "build_repository.py"), str(repo), "--model", "digits"]
    subprocess.run(build, check=True, capture_output=True)
    config = repo / "digits" / "config.pbtxt"
    lines = [f"max_batch_size: {MAX_ROWS}" if line.startswith("max_batch_size") else line
             for line in config.read_text().splitlines()]  # fmt: skip
    config.write_text("\n".join(lines) + "\n")
    return repo


def median_ms(call: Callable[[], object], count: int) -> float:
    call()
    call()
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def measure(module, client, rows: int, count: int) -> tuple[float, float]:
    """``(median ms with tensors, median ms through shared memory)`` for ROWS rows."""
    x = np.random.default_rng(rows).random((rows, 64), dtype=np.float32)
    in_bytes, out_bytes = x.nbytes, rows * 10 * 4
    key = f"/naiad_bench_{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region("bench", key, in_bytes + out_bytes)
    try:
        shm.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory("bench", key, in_bytes + out_bytes)

        def tensors() -> None:
            tensor = module.InferInput("input", [rows, 64], "FP32")
            tensor.set_data_from_numpy(x)
            wanted = [module.InferRequestedOutput("probabilities")]
            client.infer("digits", [tensor], outputs=wanted).as_numpy("probabilities")

        def regions() -> None:
            tensor = module.InferInput("input", [rows, 64], "FP32")
            tensor.set_shared_memory("bench", in_bytes)
            output = module.InferRequestedOutput("probabilities")
            output.set_shared_memory("bench", out_bytes, offset=in_bytes)
            client.infer("digits", [tensor], outputs=[output])
            shm.get_contents_as_numpy(handle, np.float32, [rows, 10], offset=in_bytes)

        return median_ms(tensors, count), median_ms(regions, count)
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 4096, 16384])
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        process, http_port, grpc_port = start_serve(build_repository(workdir), workdir)
        clients = [
            ("HTTP", httpclient, httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")),
            ("gRPC", grpcclient, grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")),
        ]
        try:
            print("| transport | rows | input MB | tensors p50 ms | shared memory p50 ms |")
            print("| --- | --- | --- | --- | --- |")
            for name, module, client in clients:
                for rows in args.rows:
                    plain, regions = measure(module, client, min(rows, MAX_ROWS), args.requests)
                    print(f"| {name} | {rows} | {rows * 256 / 1e6:.2f} | {plain:.2f} | {regions:.2f} |")
        finally:
            for _, _, client in clients:
                client.close()
            process.send_signal(signal.SIGINT)
            process.wait(60)
            shutil.rmtree(workdir / "cache", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
