"""Start and stop a real ``naiad serve`` process for end-to-end tests.

:func:`run_server` starts ``python -m naiad_cli serve`` on free loopback ports with its own
cache folder and log file, waits for ``/v2/health/ready`` to answer 200, and on the way out
sends SIGINT, waits (SIGKILL after 15 s) and checks that no worker, redis-server or other
child of that server is left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import psutil
import requests
from onnx import TensorProto, helper
from redis.asyncio import Redis

from naiad import keys
from naiad.queue_client import QueueDispatcher
from naiad.redis_client import connect

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 30.0
# naiad serve bounds its own shutdown (grace + naiad_cli.SHUTDOWN_MARGIN_S, then the workers'
# stop); servers here get a short grace, so this is generous for a loaded 2-core machine.
STOP_TIMEOUT_S = 30.0
SHUTDOWN_GRACE_S = 3


#: The lowest port :func:`free_port` hands out (it stays below the kernel's ephemeral range).
LOW_PORT = 10_000
_given_ports: set[int] = set()


def _ephemeral_start() -> int:
    """The first port the kernel hands to outgoing connections
    (``net.ipv4.ip_local_port_range``; 32768, Linux's default, where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A TCP port nothing is bound to, not given before by this process, below the
    ephemeral range: a port the kernel picked for us (``bind(0)``) may be handed to an
    outgoing connection before the server binds it (EADDRINUSE); one below the range never is."""
    start = _ephemeral_start()
    for _ in range(1_000):
        port = random.randrange(LOW_PORT, start) if start > LOW_PORT + 1_000 else 0
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            port = sock.getsockname()[1]
        if port not in _given_ports:
            _given_ports.add(port)
            return port
    raise RuntimeError("no free TCP port found")


def wait_for(condition: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.05):
    """Poll ``condition`` until it returns a truthy value; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def answers_http(url: str, read_timeout_s: float = 10.0) -> bool:
    """``url`` answered with any HTTP status. Not yet listening, or listening but not answering
    within ``read_timeout_s`` (moto's server loads its backends on its first request: 2.5 s
    on this machine's 2 cores, more under a test suite's load): False, to be polled again."""
    try:
        requests.get(url, timeout=(1.0, read_timeout_s))
    except (requests.ConnectionError, requests.Timeout):
        return False
    return True


@dataclass
class NaiadServer:
    """A running ``naiad serve``: its ports, folders and process."""

    process: subprocess.Popen
    http_port: int
    metrics_port: int
    cache_dir: Path
    grpc_port: int
    log_path: Path
    known_children: dict[int, psutil.Process] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """``host:port`` as tritonclient wants it."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint, as tritonclient.grpc wants it."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> str:
        response = requests.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5)
        response.raise_for_status()
        return response.text

    def workers(self, model: str) -> float:
        """Value of ``naiad_model_workers{model="..."}``; fails if the series is missing."""
        match = re.search(
            rf'^naiad_model_workers\{{model="{re.escape(model)}"\}} (\S+)$', self.metrics(), re.M
        )
        assert match, f"no naiad_model_workers series for {model!r} in metrics"
        return float(match.group(1))

    def children(self) -> list[psutil.Process]:
        """Live descendants (embedded redis-server, workers); remembered for teardown."""
        try:
            found = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            found = []
        for child in found:
            self.known_children.setdefault(child.pid, child)
        return [c for c in found if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]

    def worker_processes(self, model: str | None = None) -> list[psutil.Process]:
        """``naiad worker`` processes of this server (by their unique ``--cache-dir``): all of
        them (warm-pool processes included), or those serving ``model`` — started with
        ``--model`` it, or warm-pool processes the scaler gave it (its log names their pids)."""
        claimed = self.claimed_pids(model) if model is not None else set()
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            cmd = " ".join(proc.info["cmdline"] or []).split()  # a claimed pool process's title is one string
            if proc.info["status"] == psutil.STATUS_ZOMBIE or "worker" not in cmd:
                continue
            if str(self.cache_dir) not in cmd:
                continue
            if model is None or model in cmd or ("--pool" in cmd and proc.pid in claimed):
                found.append(proc)
        return found

    def claimed_pids(self, model: str | None = None) -> set[int]:
        """Pids the scaler logged as started workers (of ``model``, or of any model)."""
        started = re.findall(r"started worker pid (\d+) for model '([^']+)'", self.log())
        return {int(pid) for pid, name in started if model is None or name == model}

    def pool_processes(self) -> list[psutil.Process]:
        """Idle warm-pool processes: ``naiad worker --pool`` not (yet) given to a model."""
        claimed = self.claimed_pids()
        return [p for p in self.worker_processes()
                if p.pid not in claimed and "--pool" in (p.info["cmdline"] or [])]  # fmt: skip

    def stop(self) -> None:
        """SIGINT, wait (SIGKILL after 15 s); assert a clean exit and no process left behind."""
        self.children()
        killed = False
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                killed = True
        # Children get SIGTERM from the kernel when serve dies (PR_SET_PDEATHSIG); give them
        # the same bound before calling them leaked.
        _, alive = psutil.wait_procs(list(self.known_children.values()), timeout=STOP_TIMEOUT_S)
        leftovers = alive + [p for p in self.worker_processes() if p.pid not in {a.pid for a in alive}]
        for proc in leftovers:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        assert not killed, f"naiad serve ignored SIGINT for {STOP_TIMEOUT_S} s; log:\n{self.log()[-3000:]}"
        assert not leftovers, f"processes left after shutdown: {[p.pid for p in leftovers]}"


def start_server(
    repository: str | Path,
    workdir: Path,
    *,
    idle_timeout_s: float = 60.0,
    redis_url: str | None = None,
    request_timeout_s: float | None = None,
    extra_env: dict[str, str] | None = None,
    command: str = "serve",
    extra_args: Sequence[str] = (),
) -> NaiadServer:
    """Start ``naiad serve`` (or ``command``: ``gateway`` needs ``redis_url``) with its cache
    and log under ``workdir``; wait until ready."""
    workdir.mkdir(parents=True, exist_ok=True)
    cache_dir, log_path = workdir / "cache", workdir / "serve.log"
    http_port, metrics_port, grpc_port = free_port(), free_port(), free_port()
    args = [
        sys.executable, "-m", "naiad_cli", command,
        "--model-repository", str(repository),
        "--http-port", str(http_port),
        "--metrics-port", str(metrics_port),
        "--grpc-port", str(grpc_port),
        "--idle-timeout", str(idle_timeout_s),
        "--cache-dir", str(cache_dir),
        "--shutdown-grace", str(SHUTDOWN_GRACE_S),
    ]  # fmt: skip
    if redis_url:
        args += ["--redis-url", redis_url]
    if request_timeout_s is not None:
        args += ["--request-timeout", str(request_timeout_s)]
    if not any(arg.startswith("--gateway-processes") for arg in extra_args):
        # one gateway process unless a test asks for more: the default (one a CPU, at most
        # gateway.siblings.AUTO_MOST) would start a second on each server of the suite (~1.3 s
        # each); tests/e2e/test_gateway_processes.py runs the default and explicit counts
        args += ["--gateway-processes", "1"]
    args += list(extra_args)  # e.g. --model-control-mode explicit --load-model digits
    env = {**os.environ, **(extra_env or {}), "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = NaiadServer(process, http_port, metrics_port, cache_dir, grpc_port=grpc_port, log_path=log_path)
    try:
        wait_for(lambda: _ready(server), READY_TIMEOUT_S, "/v2/health/ready == 200")
    except BaseException:
        server.stop()
        raise
    server.children()
    return server


def _ready(server: NaiadServer) -> bool:
    if server.process.poll() is not None:
        raise AssertionError(f"naiad serve exited with {server.process.returncode}:\n{server.log()}")
    try:
        return requests.get(f"{server.http}/v2/health/ready", timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


@contextlib.contextmanager
def run_server(repository: str | Path, workdir: Path, **kwargs) -> Iterator[NaiadServer]:
    server = start_server(repository, workdir, **kwargs)
    try:
        yield server
    finally:
        server.stop()


def python_model(folder: Path, name: str, config: str, model_py: str) -> Path:
    """A repository at ``folder`` holding one Python-backend model ``name``: ``config`` as its
    ``config.pbtxt`` and ``model_py`` as version 1's ``model.py``. Returns ``folder``."""
    (folder / name / "1").mkdir(parents=True)
    (folder / name / "config.pbtxt").write_text(config)
    (folder / name / "1" / "model.py").write_text(model_py)
    return folder


def upload_tree(endpoint: str, bucket: str, folder: Path, prefix: str) -> None:
    """Upload every file under ``folder`` to ``s3://bucket/prefix/...`` over S3's REST API."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")


#: ``naiad serve`` flags of poll mode, re-indexing every second.
POLL_EVERY_SECOND = ("--model-control-mode", "poll", "--repository-poll-secs", "1")


def s3_repository(
    endpoint: str, bucket: str, folder: Path, prefix: str
) -> tuple[str, Callable[[str, bytes | str], None]]:
    """Upload ``folder`` to ``s3://bucket/prefix`` (:func:`upload_tree`); the repository's
    URI in Triton's ``s3://host:port/bucket/prefix`` form, and ``put(key, body)`` writing
    one object under the prefix (a later upload over S3's REST API)."""
    import boto3

    upload_tree(endpoint, bucket, folder, prefix)
    client = boto3.client("s3", endpoint_url=endpoint)

    def put(key: str, body: bytes | str) -> None:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=body)

    return f"s3://{endpoint.removeprefix('http://')}/{bucket}/{prefix}", put


def run_scenario(redis_url: str, scenario: Callable[[Redis], Awaitable[None]]) -> None:
    """Run ``await scenario(redis)`` on a fresh client of ``redis_url``, closed whatever happens."""

    async def main() -> None:
        redis = connect(redis_url)
        try:
            await scenario(redis)
        finally:
            await redis.aclose()

    asyncio.run(main())


def slow_onnx(matmuls: int, side: int = 1024, width: int = 1, offset: float = 0.0) -> onnx.ModelProto:
    """An ONNX model doing real work per request: ``y = x + mean(M^k) + offset``, FP32
    ``[batch, width]`` in and out, ``M`` a ``side`` x ``side`` matrix of ``mean(x) / side``
    (built from the input, so ONNX Runtime cannot fold the ``matmuls`` MatMuls away). With
    x = 1, ``mean(M^k) = 1/side``; with x = 0 it is 0."""
    nodes = [
        helper.make_node("Constant", [], ["shape"],
                         value=helper.make_tensor("s", TensorProto.INT64, [2], [side, side])),
        helper.make_node("Constant", [], ["scale"],
                         value=helper.make_tensor("c", TensorProto.FLOAT, [], [1.0 / side])),
        helper.make_node("Constant", [], ["offset"],
                         value=helper.make_tensor("o", TensorProto.FLOAT, [], [offset])),
        helper.make_node("ReduceMean", ["x"], ["xm"], keepdims=0),
        helper.make_node("Mul", ["xm", "scale"], ["xs"]),
        helper.make_node("Expand", ["xs", "shape"], ["m0"]),
    ]  # fmt: skip
    nodes += [helper.make_node("MatMul", [f"m{i}", "m0"], [f"m{i + 1}"]) for i in range(matmuls)]
    nodes += [
        helper.make_node("ReduceMean", [f"m{matmuls}"], ["r"], keepdims=0),
        helper.make_node("Add", ["x", "r"], ["xr"]),
        helper.make_node("Add", ["xr", "offset"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, width])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def run_dispatcher_scenario(
    redis_url: str, scenario: Callable[[QueueDispatcher, Redis], Awaitable[None]], streams: Sequence[str]
) -> None:
    """Run ``await scenario(dispatcher, redis)`` with a started :class:`QueueDispatcher` and the
    workers' consumer group created on each of ``streams``; everything closed whatever happens,
    the whole bounded to 60 s."""

    async def main() -> None:
        redis, reader = connect(redis_url), connect(redis_url, longest_block_s=5)
        dispatcher = QueueDispatcher(redis, reader)
        await dispatcher.start()
        for stream in streams:
            await redis.xgroup_create(stream, keys.WORKER_GROUP, id="0", mkstream=True)
        try:
            await scenario(dispatcher, redis)
        finally:
            await dispatcher.stop()
            await reader.aclose()
            await redis.aclose()

    asyncio.run(asyncio.wait_for(main(), 60))
