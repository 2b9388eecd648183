"""Start and stop the servers a scenario compares, each on free loopback ports.

Every server runs in a process group of its own (``start_new_session``), so :meth:`Server.stop`
can end what it started — ``naiad serve``'s redis-server and workers, uvicorn's children — after
a graceful SIGINT: nothing survives a scenario. Logs go to ``workdir/<name>.log`` (overwritten
when a server of that name starts again there); :func:`run_folder` gives each scenario run its
workdir, keeping the previous run's.

- :func:`start_naiad`: ``naiad serve`` (embedded Redis) on a model repository;
- :func:`start_floor`: ``bench/floor_server.py`` (ONNX Runtime in the handler, one request at
  a time);
- :func:`start_mlserver`: MLServer 1.7 (``.bench/venvs/mlserver``) with the runtime in
  ``bench/peers/mlserver_onnx.py``, ``parallel_workers: 0`` (1.7's parallel workers crash with
  recent uvloop), adaptive batching on or off;
- :func:`start_kserve`: ``kserve.ModelServer`` (``.bench/venvs/kserve``), ``bench/peers/kserve_server.py``;
- :func:`start_triton`: real ``tritonserver`` 2.51 (``.bench/venvs/triton``, started as
  :mod:`bench.peers.triton` says), its Python backend serving the same ``model.py`` as Naiad's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from bench.peers import triton

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / ".bench" / "venvs"
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_folder(root: Path, name: str) -> Path:
    """An empty ``root/name`` for one run's server logs and Naiad's cache. The previous run's
    folder becomes ``name.prev`` and the one before it is removed, so a scenario keeps at most
    two runs on disk however often it runs."""
    folder, previous = root / name, root / f"{name}.prev"
    shutil.rmtree(previous, ignore_errors=True)
    if folder.exists():
        folder.rename(previous)
    folder.mkdir(parents=True)
    return folder


class ServerError(RuntimeError):
    """A server exited or never became ready; the message ends with its log's tail."""


@dataclass
class Server:
    """A started server: its process (group leader), ports and log."""

    name: str
    process: subprocess.Popen
    http_port: int
    grpc_port: int | None
    log_path: Path
    args: list[str]

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        if self.grpc_port is None:
            raise ServerError(f"{self.name} has no gRPC endpoint")
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def wait_ready(self, models: Sequence[str], timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until ``/v2/health/ready`` and each model's ``/ready`` answer 200."""
        paths = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in models)]
        deadline = time.monotonic() + timeout_s
        while paths:
            if self.process.poll() is not None:
                raise ServerError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ServerError(f"{self.name}: {paths[0]} not 200 after {timeout_s} s:\n{self.log_tail()}")
            try:
                ok = requests.get(f"http://{self.http_url}{paths[0]}", timeout=2).status_code == 200
            except requests.RequestException:
                ok = False
            if ok:
                paths.pop(0)
            else:
                time.sleep(0.1)

    def stop(self) -> None:
        """SIGINT, wait (bounded), then SIGKILL whatever is left of the process group."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)


def _start(
    name: str,
    args: list[str],
    workdir: Path,
    http_port: int,
    grpc_port: int | None,
    models: Sequence[str],
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    replace_env: bool = False,
) -> Server:
    """Start ``args`` (its environment: ours updated with ``env``, or ``env`` alone with
    ``replace_env``) and wait until it serves ``models``."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"{name.replace(' ', '_')}.log"
    full_env = {**({} if replace_env else os.environ), **(env or {}), "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            args, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = Server(name, process, http_port, grpc_port, log_path, args)
    try:
        server.wait_ready(models)
    except BaseException:
        server.stop()
        raise
    return server


def start_naiad(
    repository: Path,
    workdir: Path,
    models: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    name: str = "naiad",
    tree: Path = ROOT,
    env: dict[str, str] | None = None,
    python: str = sys.executable,
) -> Server:
    """``naiad serve`` with its embedded Redis; workers stay up between points (idle timeout 600 s).
    ``tree``: the source tree it runs from (another checkout of Naiad, for A/B runs:
    :mod:`bench.perf.ab`), first on ``PYTHONPATH``; ``env``: variables set for it (and so
    for its workers) beside ours; ``python``: the interpreter (of a venv with Naiad installed)."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    args = [
        python,
        "-m",
        "naiad_cli",
        "serve",
        "--model-repository",
        str(repository),
        "--http-port",
        str(http),
        "--grpc-port",
        str(grpc),
        "--metrics-port",
        str(metrics),
        "--http-address",
        "127.0.0.1",
        "--cache-dir",
        str(workdir / "naiad-cache"),
        "--idle-timeout",
        "600",
        "--log-level",
        "WARNING",
        *extra_args,
    ]
    env = {**({"PYTHONPATH": str(tree)} if tree != ROOT else {}), **(env or {})}
    return _start(name, args, workdir, http, grpc, models, env=env, cwd=tree)


def start_floor(repository: Path, workdir: Path, models: Sequence[str], name: str = "floor") -> Server:
    """``bench/floor_server.py`` over ``models``: HTTP, and gRPC ``ModelInfer``."""
    http, grpc = free_port(), free_port()
    args = [
        sys.executable,
        str(ROOT / "bench" / "floor_server.py"),
        "--model-repository",
        str(repository),
        "--port",
        str(http),
        "--grpc-port",
        str(grpc),
        "--models",
        *models,
    ]
    return _start(name, args, workdir, http, grpc, models)


def peer_python(peer: str) -> Path:
    python = VENVS / peer / "bin" / "python"
    if not python.exists():
        raise ServerError(f"{python} is missing: run `make bench-setup` first")
    return python


def mlserver_settings(
    repository: Path,
    model: str,
    adaptive_batching: bool,
    max_batch_size: int = 32,
    max_batch_time_s: float = 0.002,
) -> dict:
    """``model-settings.json`` for :class:`mlserver_onnx.OnnxModel` over ``model``'s ONNX file."""
    settings = {
        "name": model,
        "implementation": "mlserver_onnx.OnnxModel",
        "parameters": {"uri": str(repository / model / "1" / "model.onnx")},
    }
    if adaptive_batching:
        settings.update(max_batch_size=max_batch_size, max_batch_time=max_batch_time_s)
    return settings


def start_mlserver(
    repository: Path, workdir: Path, model: str, adaptive_batching: bool, name: str = "mlserver"
) -> Server:
    """MLServer 1.7, one model, ``parallel_workers: 0``, no access log (``debug: false``)."""
    python = peer_python("mlserver")
    http, grpc, metrics = free_port(), free_port(), free_port()
    folder = workdir / name.replace(" ", "_")
    (folder / model).mkdir(parents=True, exist_ok=True)
    settings = {
        "debug": False,
        "parallel_workers": 0,
        "host": "127.0.0.1",
        "http_port": http,
        "grpc_port": grpc,
        "metrics_port": metrics,
    }
    (folder / "settings.json").write_text(json.dumps(settings, indent=1))
    model_settings = mlserver_settings(repository, model, adaptive_batching)
    (folder / model / "model-settings.json").write_text(json.dumps(model_settings, indent=1))
    args = [str(python.parent / "mlserver"), "start", str(folder)]
    env = {"PYTHONPATH": str(ROOT / "bench" / "peers")}
    return _start(name, args, workdir, http, grpc, [model], env=env, cwd=folder)


def start_kserve(repository: Path, workdir: Path, model: str, name: str = "kserve") -> Server:
    """``kserve.ModelServer``, one uvicorn worker, no per-request access or latency log records."""
    python = peer_python("kserve")
    http, grpc = free_port(), free_port()
    args = [
        str(python),
        str(ROOT / "bench" / "peers" / "kserve_server.py"),
        "--model_name",
        model,
        "--model_path",
        str(repository / model / "1" / "model.onnx"),
        "--http_port",
        str(http),
        "--grpc_port",
        str(grpc),
        "--workers",
        "1",
        "--enable_latency_logging",
        "false",
        "--configure_logging",
        "false",
    ]
    return _start(name, args, workdir, http, grpc, [model])


def start_triton(repository: Path, workdir: Path, models: Sequence[str], name: str = "triton") -> Server:
    """``tritonserver`` over ``repository`` (its Python-backend models; the wheel has no other
    backend), explicit model control loading only ``models``, no response cache."""
    venv = VENVS / "triton"
    try:
        triton.triton_home(venv)
    except triton.TritonMissing as exc:
        raise ServerError(f"{exc}: run `make bench-setup` first") from exc
    http, grpc, metrics = free_port(), free_port(), free_port()
    load = [arg for model in models for arg in ("--load-model", model)]
    extra = ["--model-control-mode", "explicit", *load, "--log-info", "false"]
    backends = triton.backend_directory(triton.triton_home(venv), workdir / name)
    args = triton.command(venv, repository, backends, http, grpc, metrics, extra)
    env = triton.environment(venv)
    # cwd: not the project's root, where the stub (sys.path[0] == '') would import Naiad's
    # triton_python_backend_utils.py instead of Triton's own.
    return _start(name, args, workdir, http, grpc, models, env=env, replace_env=True, cwd=workdir)


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    try:
        yield server
    finally:
        server.stop()
