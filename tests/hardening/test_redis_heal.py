"""Issue 17, finding 2: the embedded Redis killed under load comes back by itself, with its
data; liveness and metrics while Redis is away; finding 6: ``naiad serve`` killed with
SIGKILL leaves no process and no Redis folder behind."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
import tritonclient.http as httpclient
from naiad_harness import run_server, start_server, wait_for

from naiad.redis_server import EmbeddedRedis

X = np.random.default_rng(17).random((4, 64), dtype=np.float32)


def infer(server, timeout_s: float = 30) -> np.ndarray:
    client = httpclient.InferenceServerClient(
        server.url, network_timeout=timeout_s, connection_timeout=timeout_s
    )
    try:
        tensor = httpclient.InferInput("input", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X)
        return client.infer("digits", [tensor]).as_numpy("label")
    finally:
        client.close()


def redis_processes(server) -> list[psutil.Process]:
    return [p for p in server.children() if p.name().startswith("redis-server")]


def pending(server) -> float:
    found = re.search(r'^nv_inference_pending_request_count\{model="digits",version="1"\} (\S+)$',
                      server.metrics(), re.M)
    return float(found.group(1)) if found else 0.0


def answered(server) -> bool:
    try:
        infer(server, timeout_s=5)
        return True
    except Exception:
        return False


def test_embedded_redis_killed_under_load_comes_back(example_repository, tmp_path, digits_onnx):
    expected = digits_onnx.run(["label"], {"input": X})[0]
    with run_server(example_repository, tmp_path / "serve") as server:
        np.testing.assert_array_equal(infer(server), expected)
        stats_before = requests.get(f"{server.http}/v2/models/digits/stats", timeout=10).json()
        count_before = stats_before["model_stats"][0]["inference_count"]
        stop, errors, ok = threading.Event(), [], [0]

        def load() -> None:
            while not stop.is_set():
                try:
                    infer(server, timeout_s=10)
                    ok[0] += 1
                except Exception as exc:  # 503s while Redis is away
                    errors.append(type(exc).__name__)
                    time.sleep(0.05)

        threads = [threading.Thread(target=load) for _ in range(2)]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: ok[0] >= 10, 60, "some answers before the kill")
            (victim,) = redis_processes(server)
            victim.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            assert requests.get(f"{server.http}/v2/health/live", timeout=5).status_code == 200
            served = ok[0]
            wait_for(lambda: ok[0] > served + 5, 60, "answers again after the restart")
            print(f"embedded redis back and serving {time.monotonic() - killed_at:.2f} s after kill -9")
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        assert not psutil.pid_exists(victim.pid) or victim.status() != psutil.STATUS_ZOMBIE
        assert "restarting it" in server.log()
        response = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10)
        assert response.status_code == 200 and "naiad_redis_up 1" in response.text
        refused: list[str] = []  # a statistics read may still meet the restart (a 503): retried

        def read_stats() -> dict | None:
            response = requests.get(f"{server.http}/v2/models/digits/stats", timeout=10)
            if response.status_code == 200:
                return response.json()
            refused.append(f"{response.status_code} {response.text}")
            return None

        stats = wait_for(read_stats, 20, "the statistics read after the restart")
        print("statistics reads refused before one answered:", refused)
        assert all(r.startswith("503 ") for r in refused), (refused, server.log()[-4000:])
        assert stats["model_stats"][0]["inference_count"] >= count_before  # data kept (AOF)
        np.testing.assert_array_equal(infer(server), expected)


def test_request_queued_when_redis_dies_is_answered(example_repository, tmp_path, digits_onnx):
    """A request waiting in the stream when Redis is killed is still there after the
    restart (append-only file) and answered."""
    expected = digits_onnx.run(["label"], {"input": X})[0]
    with run_server(example_repository, tmp_path / "serve") as server:
        infer(server)
        workers = server.worker_processes("digits")
        assert workers
        for worker in workers:
            worker.send_signal(signal.SIGSTOP)  # frozen: the next request waits in the stream
        result: dict = {}
        thread = threading.Thread(target=lambda: result.update(label=infer(server, timeout_s=60)))
        try:
            thread.start()
            wait_for(lambda: pending(server) >= 1, 20, "the request queued")
            (victim,) = redis_processes(server)
            victim.send_signal(signal.SIGKILL)
            wait_for(lambda: [p.pid for p in redis_processes(server)] not in ([], [victim.pid]), 30,
                     "redis restarted")
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGCONT)
            thread.join(90)
        np.testing.assert_array_equal(result["label"], expected)


@pytest.fixture
def external_redis(tmp_path):
    server = EmbeddedRedis(socket_path=tmp_path / "redis" / "redis.sock", appendonly=True)
    server.start()
    yield server
    server.stop()


def test_liveness_and_metrics_while_redis_is_gone(example_repository, tmp_path, external_redis):
    with run_server(example_repository, tmp_path / "serve", redis_url=external_redis.url,
                    extra_args=["--redis-down-grace", "2"]) as server:  # fmt: skip
        live = f"{server.http}/v2/health/live"
        assert requests.get(live, timeout=5).status_code == 200
        external_redis.stop()
        wait_for(lambda: requests.get(live, timeout=5).status_code == 400, 30, "not live")
        response = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10)
        assert response.status_code == 200, response.text
        assert "naiad_redis_up 0" in response.text and "nv_cpu_utilization" in response.text
        external_redis.start()
        wait_for(lambda: requests.get(live, timeout=5).status_code == 200, 30, "live again")
        wait_for(lambda: answered(server), 60, "answers again")


def test_serve_killed_leaves_no_process_nor_redis_folder(example_repository, tmp_path):
    server = start_server(example_repository, tmp_path / "serve")
    try:
        infer(server)
        family = server.children()
        assert any(p.name().startswith("redis-server") for p in family) and server.worker_processes("digits")
        folder = Path(re.search(r"embedded redis-server at (\S+)/redis\.sock", server.log()).group(1))
        assert folder.is_dir()
        os.kill(server.process.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        server.process.wait()
        _, alive = psutil.wait_procs(family, timeout=30)
        gone_s = time.monotonic() - killed_at
        assert not alive, [(p.pid, p.name()) for p in alive]
        wait_for(lambda: not folder.exists(), 30, "the Redis folder removed")
        print(f"every child gone {gone_s:.2f} s after kill -9 of naiad serve")
    finally:
        server.stop()
