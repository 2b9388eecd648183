"""The scaler's policy, graceful shutdown and version draining, on real ``naiad serve``
processes with a real ONNX model that is slow on purpose (a chain of 1024x1024 MatMuls built
from its input, so ONNX Runtime cannot fold it away: about 0.5-1 s per request here).

The warm pool is off (``NAIAD_WARM_POOL_SIZE=0``) so every worker is a ``naiad worker
--model NAME`` process that ``server.worker_processes(NAME)`` finds.
"""

from __future__ import annotations

import concurrent.futures
import signal
import time
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
import redis
import requests
import tritonclient.http as httpclient
from naiad_harness import slow_onnx, wait_for

from naiad import keys

ENV = {"NAIAD_WARM_POOL_SIZE": "0"}
SIDE = 1024


def write_model(repository: Path, name: str, parameters: dict[str, str] | None = None,
                matmuls: int = 16, version: int = 1, offset: float = 0.0) -> None:
    """Model ``name`` (config and ``version``) in ``repository``; a version folder is
    written aside and renamed into place, so a poll never sees half of it."""
    folder = repository / name
    folder.mkdir(parents=True, exist_ok=True)
    params = "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
        for k, v in (parameters or {}).items()
    )
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'instance_group [ { kind: KIND_CPU } ]\n' + params
    )
    staging = repository.parent / f".{name}-{version}"
    staging.mkdir()
    onnx.save(slow_onnx(matmuls, side=SIDE, offset=offset), str(staging / "model.onnx"))
    staging.rename(folder / str(version))


def infer(server, model: str = "slow", timeout_s: float = 60) -> float:
    """One request (x = 1); returns y, which tells the version (offset) apart."""
    triton = httpclient.InferenceServerClient(server.url, network_timeout=timeout_s)
    try:
        tensor = httpclient.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
        return float(triton.infer(model, [tensor]).as_numpy("y")[0, 0])
    finally:
        triton.close()


def decisions(server, model: str, action: str) -> float:
    for line in server.metrics().splitlines():
        if line.startswith("naiad_scaler_decisions_total{") and f'model="{model}"' in line \
                and f'action="{action}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def claimed(redis_url: str, model: str) -> int:
    """Requests a worker of ``model`` has claimed and not yet answered (XPENDING)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return client.xpending(keys.request_stream(model), keys.WORKER_GROUP)["pending"]
    except redis.ResponseError:  # no stream or group yet
        return 0
    finally:
        client.close()


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


def test_backlog_scales_up_to_the_model_max_at_once_and_down_gradually(naiad_server, repository):
    # the server default is 1 worker per model; the model's own parameter says 3
    write_model(repository, "slow", {"naiad.max_workers": "3", "naiad.target_inflight": "1"})
    server = naiad_server(repository, idle_timeout_s=4, extra_env=ENV, extra_args=[
        "--max-workers", "1", "--scale-down-period", "1.5"])
    expected = 1.0 + 1.0 / SIDE
    most = 0
    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        answers = [pool.submit(infer, server) for _ in range(9)]
        started = time.monotonic()
        while not all(a.done() for a in answers):
            most = max(most, len(server.worker_processes("slow")))
            if most == 3:
                break
            time.sleep(0.05)
        reached_s = time.monotonic() - started
        assert most == 3, f"never 3 workers: {server.log()[-3000:]}"
        assert reached_s < 5, reached_s  # within a tick or two of the burst
        wait_for(lambda: server.workers("slow") == 3, 10, "3 live workers in naiad_model_workers")
        for answer in answers:
            assert answer.result() == pytest.approx(expected)
    assert len(server.worker_processes("slow")) <= 3
    assert decisions(server, "slow", "start") == 3

    # down: one stop per period (3 -> 2 -> 1), the last one on its idle timeout
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        count = len(server.worker_processes("slow"))
        if not seen or seen[-1] != count:
            seen.append(count)
        if count == 0:
            break
        time.sleep(0.05)
    # 3 when we look first; 2 when the first stop came while the answers were being read
    assert seen[0] in (3, 2) and seen[-1] == 0, seen
    assert seen == sorted(seen, reverse=True), seen  # never up again
    assert 2 in seen, seen  # gradual: never 3 -> 0 at once
    assert decisions(server, "slow", "stop") >= 1
    wait_for(lambda: server.workers("slow") == 0, 10, "naiad_model_workers back to 0")


def test_min_workers_keeps_one_worker_through_the_idle_timeout(naiad_server, repository):
    write_model(repository, "kept", {"naiad.min_workers": "1"}, matmuls=1)
    write_model(repository, "asleep", matmuls=1)
    server = naiad_server(repository, idle_timeout_s=1, extra_env=ENV)
    # started without any request, as KEDA's minReplicaCount would
    wait_for(lambda: server.workers("kept") == 1, 20, "the minimum worker to start")
    [worker] = server.worker_processes("kept")
    time.sleep(3)  # three idle timeouts
    assert server.worker_processes("kept") == [worker]
    assert server.workers("kept") == 1
    assert server.workers("asleep") == 0
    assert infer(server, "kept") == pytest.approx(1.0 + 1.0 / SIDE)
    assert server.worker_processes("kept") == [worker]


def test_sigterm_on_a_worker_finishes_the_request_it_claimed(naiad_server, repository, redis_url):
    write_model(repository, "slow", matmuls=32)
    server = naiad_server(repository, redis_url=redis_url, extra_env=ENV)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(infer, server)
        wait_for(lambda: claimed(redis_url, "slow") == 1, 30, "the worker to claim the request")
        [worker] = server.worker_processes("slow")
        worker.send_signal(signal.SIGTERM)
        assert not answer.done()  # still running when the signal arrived
        assert answer.result() == pytest.approx(1.0 + 1.0 / SIDE)
    psutil.wait_procs([worker], timeout=10)
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
    assert claimed(redis_url, "slow") == 0
    # the next request cold-starts a fresh worker
    assert infer(server) == pytest.approx(1.0 + 1.0 / SIDE)


def test_sigterm_on_the_server_finishes_in_flight_requests(naiad_server, repository, redis_url):
    write_model(repository, "slow", matmuls=32)
    server = naiad_server(repository, redis_url=redis_url, extra_env=ENV)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(infer, server)
        wait_for(lambda: claimed(redis_url, "slow") == 1, 30, "the worker to claim the request")
        server.process.send_signal(signal.SIGTERM)
        refused = wait_for(lambda: _refused(server), 5, "the server to stop accepting")
        assert refused and not answer.done()
        assert answer.result() == pytest.approx(1.0 + 1.0 / SIDE)
    assert server.process.wait(20) == 0
    assert "serving" in server.log()


def _refused(server) -> bool:
    try:
        requests.get(f"{server.http}/v2/health/live", timeout=1)
    except requests.ConnectionError:
        return True
    return False


def test_a_new_version_drains_the_old_one_in_poll_mode(naiad_server, repository):
    old, new = 1.0 + 1.0 / SIDE, 101.0 + 1.0 / SIDE
    write_model(repository, "slow", {"naiad.max_workers": "1"}, matmuls=16)
    server = naiad_server(repository, idle_timeout_s=30, extra_env=ENV,
                          extra_args=["--model-control-mode", "poll", "--repository-poll-secs", "1"])
    assert infer(server) == pytest.approx(old)  # a worker for version 1
    [first] = server.worker_processes("slow")
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        queued = [pool.submit(infer, server) for _ in range(6)]  # several seconds of work
        time.sleep(0.5)
        write_model(repository, "slow", {"naiad.max_workers": "1"}, matmuls=16, version=2, offset=100.0)
        # every request accepted for version 1 is answered by version 1
        for answer in queued:
            assert answer.result() == pytest.approx(old)
        wait_for(lambda: _version_served(server) == ["2"], 20, "the index to list version 2 only")
        assert infer(server) == pytest.approx(new)
    wait_for(lambda: not first.is_running() or first.status() == psutil.STATUS_ZOMBIE, 20,
             "the version-1 worker to exit")
    [second] = server.worker_processes("slow")
    assert second.pid != first.pid
    log = server.log()
    assert "now serves versions [2]" in log, log[-3000:]
    assert "ERROR" not in log, log[-3000:]


def _version_served(server) -> list[str]:
    answer = requests.get(f"{server.http}/v2/models/slow", timeout=5).json()
    return answer.get("versions", [])
