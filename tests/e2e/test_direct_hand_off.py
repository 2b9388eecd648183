"""Direct hand-off end to end (naiad.reply_channel): a real ``naiad serve`` whose idle worker
takes the next request by the gateway's socket, not Redis; what happens to such a request
when that worker dies, freezes, or its client goes away."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import redis
import requests
import tritonclient.http as httpclient
from naiad_harness import ROOT, wait_for

from naiad import keys

STREAM = keys.request_stream("digits")
#: What a worker logs when it drops a request its gateway withdrew (workers.worker).
SKIPPED = "skipped a request withdrawn by its gateway"


def http_inputs(x: np.ndarray) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(x))
    return [tensor]


def executions(server) -> int:
    body = requests.get(f"{server.http}/v2/models/digits/stats", timeout=5).json()
    return body["model_stats"][0]["execution_count"]


def failures(server, reason: str) -> float:
    match = re.search(rf'^nv_inference_request_failure\{{[^}}]*reason="{reason}"[^}}]*\}} (\S+)$',
                      server.metrics(), re.M)  # fmt: skip
    return float(match.group(1)) if match else 0.0


def xadds(r: redis.Redis) -> int:
    """Entries added to any stream so far (the enqueue script's XADDs count)."""
    return r.info("commandstats").get("cmdstat_xadd", {}).get("calls", 0)


def labels(digits_onnx, x: np.ndarray) -> np.ndarray:
    return digits_onnx.run(["label"], {"input": x})[0]


class Caller:
    """One inference on a thread of its own (the worker it goes to is frozen)."""

    def __init__(self, server, x: np.ndarray):
        self.answers: list = []
        self.thread = threading.Thread(target=self._call, args=(server, x))
        self.thread.start()

    def _call(self, server, x: np.ndarray) -> None:
        try:
            client = httpclient.InferenceServerClient(server.url, network_timeout=60)  # gevent: per thread
            self.answers.append(client.infer("digits", http_inputs(x)))
        except Exception as exc:  # shown by the assertion
            self.answers.append(exc)

    def answer(self, timeout_s: float = 60):
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the request was lost"
        (answer,) = self.answers
        assert not isinstance(answer, Exception), answer
        return answer


def warm_and_freeze(server, x: np.ndarray):
    """The first requests go through the stream (no offer yet; the first answer goes through
    Redis with the new worker's pull and load records); a direct answer carries the worker's
    offer. The worker is then frozen idle, so the next request is handed to it and stays
    unread in its socket."""
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    for _ in range(3):
        client.infer("digits", http_inputs(x))
    client.close()
    (worker,) = server.worker_processes("digits")
    time.sleep(0.3)
    worker.send_signal(signal.SIGSTOP)
    return worker


def test_sequential_requests_skip_redis_and_are_answered_right(redis_url, naiad_server, digits_holdout,
                                                               digits_onnx):  # fmt: skip
    """One client, one request at a time: after the first, requests go to the idle worker by
    the socket. Redis sees at most a few stream entries for 50 requests (each answer offers
    the next), every answer is right, and the statistics count every execution."""
    server = naiad_server(redis_url=redis_url, idle_timeout_s=30)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    r = redis.Redis.from_url(redis_url)
    x = digits_holdout[0]
    client.infer("digits", http_inputs(x[:1]))
    added = xadds(r)
    before = executions(server)
    for i in range(50):
        got = client.infer("digits", http_inputs(x[i : i + 2])).as_numpy("label")
        np.testing.assert_array_equal(got, labels(digits_onnx, x[i : i + 2]))
    assert xadds(r) - added <= 5
    assert executions(server) - before == 50


def test_a_request_handed_to_a_worker_that_is_killed_is_answered_by_another(
    redis_url, naiad_server, digits_holdout, digits_onnx
):
    """The worker holding a handed request, unread, is killed: its connection closes, the
    gateway queues the request in the stream, a new worker answers it."""
    server = naiad_server(redis_url=redis_url, idle_timeout_s=30)
    x = digits_holdout[0][:3]
    worker = warm_and_freeze(server, x)
    r = redis.Redis.from_url(redis_url)
    caller = Caller(server, x)
    time.sleep(1.5)  # the gateway has it, and it did not go through Redis
    assert r.xlen(STREAM) == 0
    worker.kill()
    np.testing.assert_array_equal(caller.answer().as_numpy("label"), labels(digits_onnx, x))
    assert "went away holding 1 requests handed to it" in server.log()


def test_a_frozen_workers_handed_request_is_answered_once_by_another(
    redis_url, naiad_server, digits_holdout, digits_onnx, example_repository, tmp_path
):
    """Worker A holds a handed request and freezes (its connection stays open): once its
    heartbeat lapses the gateway withdraws the request from A and queues it in the stream,
    where worker B answers it. A, resumed, skips the withdrawn request: the client has one
    answer and the statistics one execution."""
    env = {"NAIAD_HEARTBEAT_S": "0.5"}
    server = naiad_server(redis_url=redis_url, idle_timeout_s=30, extra_env=env)
    x = digits_holdout[0][:3]
    a = warm_and_freeze(server, x)
    before = executions(server)
    caller = Caller(server, x)
    b_log = tmp_path / "b.log"
    with b_log.open("wb") as log:
        b = subprocess.Popen(
            [sys.executable, "-m", "naiad_cli", "worker", "--model", "digits", "--redis-url", redis_url,
             "--model-repository", str(example_repository), "--idle-timeout", "30",
             "--cache-dir", str(tmp_path / "b-cache")],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env},
        )  # fmt: skip
    try:
        answer = caller.answer(40)
    finally:
        a.send_signal(signal.SIGCONT)
        b.terminate()  # drains and exits
    assert b.wait(30) == 0, b_log.read_text()
    np.testing.assert_array_equal(answer.as_numpy("label"), labels(digits_onnx, x))
    assert "holds a request without a heartbeat: queueing it again" in server.log()
    wait_for(lambda: SKIPPED in server.log(), 10, "the resumed worker's skip")
    assert executions(server) - before == 1


def test_a_handed_request_whose_client_goes_away_is_not_run(redis_url, naiad_server, digits_holdout):
    """The client of a request handed to the (frozen) worker disconnects: the gateway
    withdraws it, and the worker, resumed, skips it; the next request is executed alone."""
    server = naiad_server(redis_url=redis_url, idle_timeout_s=30)
    x = digits_holdout[0][:2]
    frozen = warm_and_freeze(server, x)
    before = executions(server)
    try:
        body = {"inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}  # fmt: skip
        try:
            requests.post(f"{server.http}/v2/models/digits/infer", json=body, timeout=1.0)
            raise AssertionError("answered by a frozen worker")
        except requests.Timeout:
            pass
        # counted once the gateway saw the client go, after it wrote the withdrawal
        wait_for(lambda: failures(server, "CANCELED") == 1, 10, "the request withdrawn")
    finally:
        frozen.send_signal(signal.SIGCONT)
    wait_for(lambda: SKIPPED in server.log(), 10, "the resumed worker's skip")
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    client.infer("digits", http_inputs(x))
    assert executions(server) - before == 1


def inferences(server) -> int:
    body = requests.get(f"{server.http}/v2/models/digits/stats", timeout=5).json()
    return body["model_stats"][0]["inference_count"]


def test_requests_that_reach_a_worker_in_one_read_run_as_one_batch(redis_url, naiad_server, digits_holdout,
                                                                    digits_onnx):  # fmt: skip
    """Two requests handed to a frozen worker wait in its socket together; resumed, it reads
    them at once and runs them as one batch (a lone request is answered within its read's
    turn, Worker._run_now; two of one read go to the serve loop, which batches them)."""
    server = naiad_server(redis_url=redis_url, idle_timeout_s=30)
    x = digits_holdout[0][:4]
    frozen = warm_and_freeze(server, x[:1])
    before, rows_before = executions(server), inferences(server)
    try:
        first, second = Caller(server, x[:2]), Caller(server, x[2:4])
        time.sleep(1.5)  # both written to the frozen worker's socket (none went through Redis)
        assert redis.Redis.from_url(redis_url).xlen(STREAM) == 0
    finally:
        frozen.send_signal(signal.SIGCONT)
    np.testing.assert_array_equal(first.answer().as_numpy("label"), labels(digits_onnx, x[:2]))
    np.testing.assert_array_equal(second.answer().as_numpy("label"), labels(digits_onnx, x[2:4]))
    assert executions(server) - before == 1 and inferences(server) - rows_before == 4


def without_batching_delay(example_repository, tmp_path):
    """A copy of the example repository whose ``digits`` batches at once (``dynamic_batching
    { }``: no ``max_queue_delay_microseconds``), so a lone request is due as it arrives."""
    repository = tmp_path / "no-delay"
    shutil.copytree(example_repository, repository)
    config = repository / "digits" / "config.pbtxt"
    text, count = re.subn(r"dynamic_batching \{[^}]*\}", "dynamic_batching { }", config.read_text())
    assert count == 1
    config.write_text(text)
    return repository


def test_requests_answered_at_once_keep_their_worker_past_its_idle_timeout(
    redis_url, naiad_server, digits_holdout, digits_onnx, example_repository, tmp_path
):
    """One request at a time for three idle timeouts to a model that batches at once: each
    is answered by the idle worker within the turn it arrives in (Worker._run_now; its
    statistics count). They count as work: the same worker serves them all, never withdrawing
    its offer (no request goes through Redis); once they stop, it leaves after its idle
    timeout (scale to zero)."""
    repository = without_batching_delay(example_repository, tmp_path)
    server = naiad_server(repository=repository, redis_url=redis_url, idle_timeout_s=1.5)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    x = digits_holdout[0][:3]
    client.infer("digits", http_inputs(x[:1]))
    (worker,) = server.worker_processes("digits")
    r = redis.Redis.from_url(redis_url)
    added, before, calls = xadds(r), executions(server), 0
    end = time.monotonic() + 4.5
    while time.monotonic() < end:
        got = client.infer("digits", http_inputs(x[calls % 3 :][:1])).as_numpy("label")
        np.testing.assert_array_equal(got, labels(digits_onnx, x[calls % 3 :][:1]))
        calls += 1
        time.sleep(0.2)
        assert worker.is_running() and server.worker_processes("digits") == [worker]
    assert xadds(r) - added == 0  # all by the socket: the worker never went idle
    assert executions(server) - before == calls
    wait_for(lambda: not server.worker_processes("digits"), 10, "the idle worker's exit")


def test_a_killed_workers_heartbeat_is_removed_so_its_replacement_starts_at_once(
    redis_url, naiad_server, digits_holdout, digits_onnx
):
    """The only worker, holding a handed request, is killed (-9): it cannot remove its own
    heartbeat, which would count it live for 3 heartbeat periods (15 s here) and hold back
    its replacement; the scaler, seeing its process gone, removes it, and a new worker
    answers the request before that heartbeat would have lapsed."""
    server = naiad_server(redis_url=redis_url, idle_timeout_s=30, extra_env={"NAIAD_HEARTBEAT_S": "5"})
    x = digits_holdout[0][:3]
    worker = warm_and_freeze(server, x)
    r = redis.Redis.from_url(redis_url)
    (member,) = r.zrangebyscore(keys.workers("digits"), time.time(), "+inf")
    caller = Caller(server, x)
    time.sleep(1.0)  # handed to the frozen worker
    lapses_at = r.zscore(keys.workers("digits"), member)  # its last heartbeat's deadline
    worker.kill()
    np.testing.assert_array_equal(caller.answer(60).as_numpy("label"), labels(digits_onnx, x))
    assert time.time() < lapses_at  # answered while the dead worker's heartbeat still stood
    assert member not in r.zrange(keys.workers("digits"), 0, -1)


SLEEPER_CONFIG = """name: "sleeper"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""
SLEEPER_MODEL = '''import json, time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            time.sleep(json.loads(request.parameters()).get("sleep_ms", 0) / 1000)
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return out
'''


def with_sleeper(example_repository, tmp_path):
    """The example repository plus ``sleeper``: a Python model that answers ``X + 1`` after
    sleeping the request's ``sleep_ms`` parameter."""
    repository = tmp_path / "with-sleeper"
    shutil.copytree(example_repository, repository)
    (repository / "sleeper" / "1").mkdir(parents=True)
    (repository / "sleeper" / "config.pbtxt").write_text(SLEEPER_CONFIG)
    (repository / "sleeper" / "1" / "model.py").write_text(SLEEPER_MODEL)
    return repository


def sleep_for(client, ms: float, value: float = 1.0) -> float:
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return float(client.infer("sleeper", [x], parameters={"sleep_ms": ms}).as_numpy("Y")[0])


def gateway_processes(server) -> list[psutil.Process]:
    """The server's gateway processes: ``naiad serve`` and its siblings (``naiad_cli gateway``)."""
    siblings = [p for p in server.children() if "naiad_cli gateway" in " ".join(p.cmdline())]
    return [psutil.Process(server.process.pid), *siblings]


def gateways_cpu_s(server, action) -> float:
    """CPU seconds all the server's gateway processes used while ``action()`` ran."""
    processes = gateway_processes(server)
    before = sum(sum(p.cpu_times()[:2]) for p in processes)
    action()
    return sum(sum(p.cpu_times()[:2]) for p in processes) - before


def test_the_gateway_polls_for_the_servers_only_answer_within_its_budget(
    naiad_server, example_repository, tmp_path
):
    """naiad.busy_poll end to end: a gateway whose server carries one request, handed to an
    idle worker, waits for the answer awake (an 80 ms answer under a 100 ms budget costs the
    gateway tens of ms of CPU, unless another thread took its CPU); under the default budget
    (0.5 ms) a model that takes 40 ms a request is slept for: ten such requests cost the
    gateway far less CPU than the 400 ms that polling through them would."""
    repository = with_sleeper(example_repository, tmp_path)
    server = naiad_server(repository=repository, idle_timeout_s=30, extra_args=["--busy-poll-us", "100000"])
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    assert sleep_for(client, 0) == 2.0  # the worker started, then idle: its offer comes
    assert sleep_for(client, 0, 2.0) == 3.0
    # best of five: a poll stops when another thread takes the gateway's CPU (a busy machine)
    polled = max(gateways_cpu_s(server, lambda: sleep_for(client, 80)) for _ in range(5))
    assert polled > 0.02, f"the gateway used at most {polled:.3f} s of CPU awaiting an 80 ms answer"

    default = naiad_server(repository=repository, idle_timeout_s=30)
    client = httpclient.InferenceServerClient(default.url, network_timeout=60)
    for _ in range(3):
        sleep_for(client, 40)  # the worker up, its offer taken, the model judged slow
    used = gateways_cpu_s(default, lambda: [sleep_for(client, 40, float(i)) for i in range(10)])
    assert used < 0.15, f"the gateway used {used:.3f} s of CPU for 10 requests of 40 ms"


def test_two_gateway_processes_poll_only_while_the_server_carries_one_request(
    naiad_server, example_repository, tmp_path
):
    """With two gateway processes (gateway.inflight): one request at a time is polled for,
    whichever process has it; two at once are not, even when each process carries one
    (each connection's process is the kernel's pick: ten pairs of fresh connections make
    pairs on different processes near certain; polled, each would cost ~80 ms of CPU)."""
    repository = with_sleeper(example_repository, tmp_path)
    server = naiad_server(repository=repository, idle_timeout_s=30,
                          extra_args=["--busy-poll-us", "100000", "--gateway-processes", "2"])  # fmt: skip
    assert len(gateway_processes(server)) == 2
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    assert sleep_for(client, 0) == 2.0 and sleep_for(client, 0, 2.0) == 3.0
    alone = max(gateways_cpu_s(server, lambda: sleep_for(client, 80)) for _ in range(5))
    assert alone > 0.02, f"the gateways used at most {alone:.3f} s of CPU awaiting an 80 ms answer"

    def pair() -> None:
        clients = [httpclient.InferenceServerClient(server.url, network_timeout=60) for _ in range(2)]
        threads = [threading.Thread(target=sleep_for, args=(c, 80)) for c in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    together = gateways_cpu_s(server, lambda: [pair() for _ in range(10)])
    assert together < 0.08, f"the gateways used {together:.3f} s of CPU for ten pairs of 80 ms answers"
