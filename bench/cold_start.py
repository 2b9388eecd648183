"""Cold-start benchmark: from a request to a model at zero to its answer, warm pool vs bare.

Starts its own ``naiad serve`` (embedded Redis, free ports, ``--log-format json``) per model
and mode on a built repository: ``bare`` (``--warm-pool-size 0``: every cold start spawns a
bare ``naiad worker`` process), ``pool`` (one warm-pool process of the default pool: ONNX
Runtime imported, a framework model imports its own after the claim) and ``framework`` (one
process of the model's own backend's pool, ``--warm-pool-backend B``: its framework already
imported). Each time it forces ``--runs`` cold starts of the model: one request (one row of
zeros, shaped from the model's metadata) through ``tritonclient.http``, then it waits until
the worker left (``naiad_model_workers`` back to 0, after the ``--idle-timeout``) and, with a
pool, until the pool's replacement process logged that it is ready. It prints Markdown: p50/p90/max of
the client's latency, and the p50 of where the time went, from the worker's "ready" log
record (:func:`workers.cold_start.cold_start_phases`) and the statistics extension:

- *to worker*: request sent → the process started (bare) or was claimed (pool): the
  gateway's enqueue, the scaler's wake-up and its spawn or claim;
- *start*: bare: interpreter, imports, settings; pool: the claim reaching the process;
- *registry*, *open*, *pull*, *load*, *warmup*: Redis round trips and registry entry, opening
  the repository, the local cache check/download, the backend's load, the config's
  ``model_warmup`` samples;
- *to answer*: ready → answer at the client: the first read of the queue, the first
  inference (*compute* of it: Triton's three compute phases), the reply through the gateway.

*total − load* is what a cold start costs beyond the model's own load (issue 14's target:
≤ 100 ms with the model's framework pool).

    .venv/bin/python bench/cold_start.py [--repository BUILT_REPO] [--models digits ...]
        [--runs 10] [--modes bare pool framework]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import requests
import tritonclient.http as httpclient

from workers.cold_start import cold_start_phases

ROOT = Path(__file__).resolve().parents[1]
#: The worker's cold-start phases, in its order (start, registry, open, pull, load, warmup).
PHASES = tuple(cold_start_phases(0.0, {}, [], 0.0))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One ``naiad serve`` with JSON logs in ``workdir/serve.log``."""

    def __init__(self, repo: Path, workdir: Path, pool_args: list[str], idle_timeout_s: float):
        self.http, self.metrics_port = free_port(), free_port()
        self.log_path = workdir / "serve.log"
        args = [sys.executable, "-m", "naiad_cli", "serve", "--model-repository", str(repo),
                "--http-port", str(self.http), "--grpc-port", str(free_port()),
                "--metrics-port", str(self.metrics_port), "--cache-dir", str(workdir / "cache"),
                "--idle-timeout", str(idle_timeout_s), *pool_args,
                "--log-format", "json"]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        self.wait(lambda: self._get(f"http://127.0.0.1:{self.http}/v2/health/ready"), 60, "ready")

    def _get(self, url: str) -> requests.Response | None:
        if self.process.poll() is not None:
            raise SystemExit(f"naiad serve exited:\n{self.log_path.read_text()[-3000:]}")
        try:
            response = requests.get(url, timeout=2)
        except requests.ConnectionError:
            return None
        return response if response.ok else None

    def wait(self, condition, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}")
            time.sleep(0.02)

    def workers(self, model: str) -> float:
        text = self._get(f"http://127.0.0.1:{self.metrics_port}/metrics").text
        return float(re.search(rf'^naiad_model_workers\{{model="{model}"\}} (\S+)$', text, re.M).group(1))

    def records(self) -> list[dict]:
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                found.append(json.loads(line))
        return found

    def worker_processes(self) -> int:
        """``naiad worker`` children of the server: claimed or idle pool processes, bare ones."""
        count = 0
        for child in psutil.Process(self.process.pid).children():
            try:
                args = " ".join(child.cmdline()).split()  # a claimed pool process's title is one string
                count += child.status() != psutil.STATUS_ZOMBIE and "worker" in args
            except psutil.NoSuchProcess:
                pass
        return count

    def pool_ready_count(self) -> int:
        return sum("warm_pool_ready" in record for record in self.records())

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(30)


def compute_ns(url: str, model: str) -> int:
    stat = requests.get(f"http://{url}/v2/models/{model}/stats", timeout=5).json()["model_stats"][0]
    return sum(stat["inference_stats"][k]["ns"] for k in ("compute_input", "compute_infer", "compute_output"))


def zeros_input(url: str, model: str) -> httpclient.InferInput:
    """One request's input for ``model``: zeros of its first input's shape (-1 → 1), FP32."""
    metadata = requests.get(f"http://{url}/v2/models/{model}", timeout=5).json()
    first = metadata["inputs"][0]
    shape = [1 if d == -1 else d for d in first["shape"]]
    tensor = httpclient.InferInput(first["name"], shape, first["datatype"])
    tensor.set_data_from_numpy(np.zeros(shape, dtype=np.float32))
    return tensor


def one_cold_start(server: Server, model: str) -> dict:
    url = f"127.0.0.1:{server.http}"
    before = compute_ns(url, model)
    client = httpclient.InferenceServerClient(url, network_timeout=120)
    tensor = zeros_input(url, model)
    sent, t0 = time.time(), time.perf_counter()
    client.infer(model, [tensor])
    total = time.perf_counter() - t0
    first_compute_s = (compute_ns(url, model) - before) / 1e9
    t1 = time.perf_counter()
    client.infer(model, [tensor])  # the same request to the worker now up: the baseline
    hot = time.perf_counter() - t1
    client.close()
    cold = [r["cold_start"] for r in server.records() if "cold_start" in r]
    if not cold or cold[-1]["origin"] < sent - 1.0:  # a worker that was still up answered
        raise SystemExit("the request found a live worker: no cold start")
    return row_of(cold[-1], sent, total, first_compute_s, hot)


def row_of(cold_start: dict, sent: float, total: float, compute_s: float, hot: float) -> dict:
    """One run's seconds by column: the worker's ``cold_start`` log record (its ``origin``,
    ``seconds`` and :data:`PHASES`), the request's ``sent`` (Unix s) and ``total`` latency,
    the first inference's ``compute_s`` and the ``hot`` request's latency."""
    c = cold_start
    return {"total": total, "to worker": c["origin"] - sent, **{p: c[p] for p in PHASES},
            "to answer": sent + total - (c["origin"] + c["seconds"]),
            "compute": compute_s, "hot": hot}  # fmt: skip


#: Each mode's ``naiad serve`` flags (given the model's backend) and its table label.
MODES = {
    "bare": (lambda backend: ["--warm-pool-size", "0"], "bare process"),
    "pool": (lambda backend: ["--warm-pool-size", "1"], "warm pool (onnxruntime)"),
    "framework": (lambda backend: ["--warm-pool-size", "1", "--warm-pool-backend", backend],
                  "warm pool (own backend)"),
}


def backend_of_model(repo: Path, model: str) -> str:
    from repository_store import backend_of  # noqa: PLC0415
    from repository_store.config import parse_config  # noqa: PLC0415

    return backend_of(parse_config((repo / model / "config.pbtxt").read_text(), model))


def run_mode(repo: Path, model: str, mode: str, runs: int, idle_timeout_s: float) -> list[dict]:
    pool_args = MODES[mode][0](backend_of_model(repo, model))
    pooled = mode != "bare"
    with tempfile.TemporaryDirectory(prefix="naiad-bench-") as tmp:
        server = Server(repo, Path(tmp), pool_args, idle_timeout_s)
        try:
            rows = []
            for index in range(runs):
                if pooled:  # the pool's process for this run (the first, or a refill) is ready
                    server.wait(lambda n=index: server.pool_ready_count() > n, 120, "the warm-pool process")
                rows.append(one_cold_start(server, model))
                server.wait(lambda: server.workers(model) == 0, 60, "the worker's idle exit")
                # ... and its process gone (one still exiting would delay the next start a tick)
                server.wait(lambda: server.worker_processes() <= int(pooled), 60, "the worker's exit")
            return rows
        finally:
            server.stop()


def ms(values: list[float], q: float) -> str:
    return f"{np.percentile(values, q) * 1000:.1f}"


def table(results: dict[tuple[str, str], list[dict]]) -> str:
    head = ["model", "mode", "runs", "p50 ms", "p90 ms", "max ms", "total − load p50", "to worker", *PHASES,
            "to answer", "(compute)", "hot p50 ms"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for (model, mode), rows in results.items():
        col = {k: [r[k] for r in rows] for k in rows[0]}
        over = [r["total"] - r["load"] for r in rows]
        phases = ("to worker", *PHASES, "to answer", "compute", "hot")
        cells = [model, MODES[mode][1], str(len(rows)), ms(col["total"], 50), ms(col["total"], 90),
                 ms(col["total"], 100), ms(over, 50), *(ms(col[k], 50) for k in phases)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"^Model name:\s*(.+)$", lscpu, re.M)
    cpu = model.group(1).strip() if model else "?"
    return f"nproc {os.cpu_count()}, CPU {cpu}, Python {sys.version.split()[0]}"


def build_resnet(repo: Path) -> None:
    """``resnet50_pytorch`` (:mod:`bench.perf.resnet`) into ``repo``."""
    if str(ROOT) not in sys.path:  # run as a script: bench/ is on sys.path, not the root
        sys.path.insert(0, str(ROOT))
    from bench.perf import resnet  # noqa: PLC0415

    resnet.build(repo)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, help="an example repository already built")
    parser.add_argument("--models", nargs="+", default=["digits"], help="models of the repository")
    parser.add_argument("--runs", type=int, default=10, help="cold starts per model and mode")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=["bare", "pool"])
    parser.add_argument("--idle-timeout", type=float, default=0.5, help="the workers' idle timeout, s")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="naiad-bench-repo-") as tmp:
        repo = args.repository
        if repo is None:
            repo = Path(tmp) / "models"
            subprocess.run([sys.executable, str(ROOT / "examples" / "build_repository.py"), str(repo)],
                           check=True, capture_output=True)  # fmt: skip
        if "resnet50_pytorch" in args.models and not (repo / "resnet50_pytorch").exists():
            build_resnet(repo)
        results = {(model, mode): run_mode(repo, model, mode, args.runs, args.idle_timeout)
                   for model in args.models for mode in args.modes}  # fmt: skip
    print(f"{args.runs} cold starts per model and mode; {machine()}\n")
    print(table(results))
    print("\nPhases: p50 in ms. 'to worker' = request → process start (bare) or claim (pool); "
          "'to answer' = worker ready → answer at the client, of which '(compute)' is the first inference; "
          "'hot' = the same request again, to the worker now up.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
