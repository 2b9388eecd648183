"""Start and stop real Triton 2.51 (the ``nvidia-pytriton`` wheel's ``tritonserver``).

The wheel lives in its own venv (``.venv-triton`` at the project root, made by ``make
triton-venv``; ``NAIAD_TRITON_VENV`` names another), started as :mod:`bench.peers.triton`
says (the one place for that). A missing venv fails the suite: it never skips.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
from dataclasses import dataclass

import psutil
import requests
from naiad_harness import free_port, wait_for

from bench.peers import triton

ROOT = pathlib.Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0


def triton_venv() -> pathlib.Path:
    return pathlib.Path(os.environ.get("NAIAD_TRITON_VENV", ROOT / ".venv-triton"))


def triton_home(venv: pathlib.Path) -> pathlib.Path:
    """The wheel's ``pytriton/tritonserver`` folder; AssertionError (never a skip) if absent."""
    try:
        return triton.triton_home(venv)
    except triton.TritonMissing as exc:
        raise AssertionError(f"real Triton is missing: {exc} (run `make triton-venv`, which installs "
                             "nvidia-pytriton from PyPI; `make test` does it first)") from None


@dataclass
class TritonServer:
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    log_path: pathlib.Path
    backends: pathlib.Path
    """This server's private backend folder: its stub processes run from there."""

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def errors(self) -> str:
        """The log's error lines (``E...``, ``error: ...``)."""
        return "\n".join(
            line for line in self.log().splitlines() if line[:1] == "E" or line.startswith("error")
        )

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 30 s), then kill any Python-backend stub of this server left
        behind (a Triton that died leaves its stubs running)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        stubs = [
            p
            for p in psutil.process_iter(["cmdline"])
            if str(self.backends) in " ".join(p.info["cmdline"] or [])
        ]
        for stub in stubs:
            with contextlib.suppress(psutil.Error):
                stub.kill()
        psutil.wait_procs(stubs, timeout=10)


def _ready(server: TritonServer) -> bool:
    assert server.process.poll() is None, f"tritonserver exited:\n{server.errors()}"
    try:
        return requests.get(server.http + "/v2/health/ready", timeout=1).status_code == 200
    except (requests.ConnectionError, requests.Timeout):
        return False


def start_triton(repository: pathlib.Path, workdir: pathlib.Path, cache_bytes: int = 1 << 24) -> TritonServer:
    """``tritonserver`` on free loopback ports serving ``repository``, with the local response
    cache of ``cache_bytes``; waits until ready."""
    venv = triton_venv()
    home = triton_home(venv)
    workdir.mkdir(parents=True, exist_ok=True)
    env = triton.environment(venv)
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    backends = triton.backend_directory(home, workdir)
    extra = ["--cache-config", f"local,size={cache_bytes}"]
    args = triton.command(venv, repository, backends, http_port, grpc_port, metrics_port, extra)
    log_path = workdir / "triton.log"
    with log_path.open("wb") as log:
        # cwd: the stub puts '' first on sys.path, so from the project's root it would import
        # Naiad's triton_python_backend_utils.py instead of Triton's own.
        process = subprocess.Popen(args, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = TritonServer(process, http_port, grpc_port, log_path, backends)
    try:
        wait_for(lambda: _ready(server), READY_TIMEOUT_S, "tritonserver /v2/health/ready == 200")
    except BaseException:
        server.stop()
        raise
    return server
