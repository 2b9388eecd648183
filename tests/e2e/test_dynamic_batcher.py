"""Triton's dynamic batcher through a real ``naiad serve``, its worker and tritonclient: a
high-priority request overtakes queued low-priority ones, each priority level's
``max_queue_size`` refuses at once, REJECT and DELAY queue timeouts (with
``allow_timeout_override``), and batches of the preferred sizes counted in ``batch_stats``
while concurrent requests of different batch sizes each get their own rows back.

The worker is frozen (SIGSTOP) while it waits in ``XREADGROUP``, so requests pile up in the
streams in a known order, then resumed; ``--max-workers 1`` keeps the scaler from adding a
second worker that would drain them meanwhile."""

from __future__ import annotations

import re
import shutil
import signal
import threading
import time

import msgpack
import numpy as np
import pytest
import redis
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from naiad_harness import wait_for

from naiad import keys
from naiad.inference import InferRequest, Tensor
from workers import batching

LOW, HIGH = keys.request_stream("digits", 2), keys.request_stream("digits", 1)


def repository(tmp_path, example_repository, dynamic_batching: str, max_batch_size: int = 64):
    """The example ``digits`` model with its ``dynamic_batching`` (and max_batch_size) replaced."""
    root = tmp_path / "repo"
    shutil.copytree(example_repository / "digits", root / "digits")
    config = root / "digits" / "config.pbtxt"
    block = f"dynamic_batching {{ {dynamic_batching} }}"
    text = re.sub(r"dynamic_batching \{[^}]*\}", block, config.read_text())
    config.write_text(text.replace("max_batch_size: 64", f"max_batch_size: {max_batch_size}"))
    return root


#: For tests of what the stream's claims do with a frozen worker: with direct hand-off
#: (naiad.reply_channel) the idle worker's next request would reach it outside the stream
#: (that path: tests/e2e/test_direct_hand_off.py).
STREAM_ONLY = {"NAIAD_DIRECT_REQUESTS": "0"}


def serve(naiad_server, redis_url, repo, extra_env=None):
    return naiad_server(repository=repo, redis_url=redis_url, idle_timeout_s=30,
                        extra_args=["--max-workers", "1"], extra_env=extra_env)  # fmt: skip


def grpc_inputs(x: np.ndarray) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(x))
    return [tensor]


def http_inputs(x: np.ndarray) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(x))
    return [tensor]


def freeze(server, x, **kwargs):
    """Warm the model, let its one worker go back to its blocking read, SIGSTOP it there (it
    still claims the next entry: Redis hands it over to the stopped process's socket)."""
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        client.infer("digits", http_inputs(x), **kwargs)
    finally:
        client.close()
    (worker,) = server.worker_processes("digits")
    time.sleep(0.3)
    worker.send_signal(signal.SIGSTOP)
    return worker


class Acks:
    """The order the worker answered requests in, as Redis saw it: the entry ids of its
    ``XACK`` commands (one per answered batch and stream), read from ``MONITOR`` on a
    thread; the client's own view can swap answers sent a few ms apart."""

    STOP = "batcher-test-acks-done"

    def __init__(self, redis_url: str):
        self.url, self.ids = redis_url, []
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _watch(self) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            with client.monitor() as monitor:
                self.ready.set()
                for event in monitor.listen():
                    words = event["command"].split()
                    if self.STOP in event["command"]:
                        return
                    if words and words[0] == "XACK":
                        self.ids += [w.encode() for w in words[3:]]
        finally:
            client.close()

    def names(self, r: redis.Redis) -> list[str]:
        """Stop watching; the request ids (``request_id``) of the acknowledged entries that
        :meth:`remember` saw, in the order they were acknowledged."""
        r.echo(self.STOP)
        self.thread.join(10)
        return [self.by_id[i] for i in self.ids if i in self.by_id]

    def remember(self, r: redis.Redis, *streams: str) -> None:
        """Note the request ids of the entries now in ``streams``."""
        self.by_id = {}
        for stream in streams:
            for entry_id, fields in r.xrange(stream):
                self.by_id[entry_id] = msgpack.unpackb(fields[b"h"])["id"]


class Calls:
    """Asynchronous gRPC calls, remembering the order their answers came back in."""

    def __init__(self, server):
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.order: list[str] = []
        self.results: dict[str, object] = {}
        self.lock = threading.Lock()

    def send(self, name: str, x: np.ndarray, **kwargs) -> None:
        def done(result, error, name=name):
            with self.lock:
                self.order.append(name)
                self.results[name] = error if error is not None else result

        self.client.async_infer("digits", grpc_inputs(x), callback=done, client_timeout=60, request_id=name,
                                **kwargs)  # fmt: skip

    def wait(self, count: int) -> None:
        """Wait for ``count`` answers, then close the client."""
        wait_for(lambda: len(self.order) >= count, 60, f"{count} answers")
        self.client.close()


@pytest.fixture
def r(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def pending(r: redis.Redis, stream: str) -> int:
    return r.xpending(stream, keys.WORKER_GROUP)["pending"]


def keep_live(r: redis.Redis) -> None:
    """Push the heartbeat deadlines of digits' workers a minute ahead: a frozen worker stays
    live (its claim counts as executing, not waiting) however slow the test runs."""
    members = r.zrange(keys.workers("digits"), 0, -1)
    r.zadd(keys.workers("digits"), dict.fromkeys(members, time.time() + 60))


def stats(server) -> dict:
    return requests.get(f"{server.http}/v2/models/digits/stats", timeout=5).json()["model_stats"][0]


def test_high_priority_overtakes_and_each_level_has_its_bound(
    r, redis_url, naiad_server, example_repository, tmp_path, digits_holdout, digits_onnx
):
    """Two levels, the default the lower one, bounded to 4 waiting requests. With the worker
    frozen executing L1 (Triton's bound counts only waiting requests): L2 (priority 0: the
    default), L3 (priority 99: above the levels, clamped to the default as Triton does), L4,
    L5 queue; the next is refused at once (503); H (priority 1) is accepted on its own level
    and, once the worker resumes, answered right after L1."""
    bound = "priority_queue_policy { key: 2 value: { max_queue_size: 4 } }"
    levels = f"priority_levels: 2 default_priority_level: 2 {bound}"
    repo = repository(tmp_path, example_repository, levels, max_batch_size=1)
    server = serve(naiad_server, redis_url, repo, STREAM_ONLY)
    x = digits_holdout[0]
    worker = freeze(server, x[:1])
    keep_live(r)
    calls, acks = Calls(server), Acks(redis_url)
    try:
        calls.send("L1", x[1:2])
        wait_for(lambda: pending(r, LOW) == 1, 10, "the frozen worker's claim")
        for name, row, priority in (("L2", 2, 0), ("L3", 3, 99), ("L4", 4, 2), ("L5", 5, 2)):
            calls.send(name, x[row : row + 1], priority=priority)
            wait_for(lambda n=row: r.xlen(LOW) == n, 10, f"{name} queued")  # one after the other
        started = time.monotonic()
        refused = requests.post(f"{server.http}/v2/models/digits/infer", timeout=5, json={
            "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x[7].tolist()}]})
        assert time.monotonic() - started < 0.5
        assert refused.status_code == 503 and "Exceeds maximum queue size" in refused.json()["error"]
        calls.send("H", x[6:7], priority=1)
        wait_for(lambda: r.xlen(HIGH) == 1, 10, "the high-priority request queued")
        acks.remember(r, LOW, HIGH)
    finally:
        worker.send_signal(signal.SIGCONT)
    calls.wait(6)
    assert acks.names(r) == ["L1", "H", "L2", "L3", "L4", "L5"]  # only L1, claimed, went before H
    for name, row in (("L1", 1), ("L2", 2), ("L3", 3), ("L4", 4), ("L5", 5), ("H", 6)):
        result = calls.results[name]
        assert not isinstance(result, Exception), result
        expected = digits_onnx.run(["label"], {"input": x[row : row + 1]})[0]
        np.testing.assert_array_equal(result.as_numpy("label"), expected)


def test_queue_timeouts_reject_and_delay(
    r, redis_url, naiad_server, example_repository, tmp_path, digits_holdout
):
    """Level 1: DELAY after 1 s; level 2 (the default): REJECT after 2 s, which a
    request's ``timeout`` may shorten but not lengthen. With the worker frozen: X (claimed by
    it) is rejected by the worker once resumed; R1 (timeout 100 ms) and R3 (timeout 5 s, not
    honoured: still 2 s) are refused while unclaimed, at once, over HTTP and gRPC, with
    Triton's "Request timeout expired"; D (level 1) outlives its timeout and is answered after
    N, a level-1 request that came later but has not timed out. Each refusal is timed only
    against the bounds that tell the rules apart (its own timeout, the level's, 5 s), so a busy
    machine cannot fail it."""
    repo = repository(tmp_path, example_repository, (
        "priority_levels: 2 default_priority_level: 2 "
        "priority_queue_policy { key: 1 value: { timeout_action: DELAY "
        "default_timeout_microseconds: 1000000 } } "
        "priority_queue_policy { key: 2 value: { timeout_action: REJECT "
        "default_timeout_microseconds: 2000000 allow_timeout_override: true } }"),
        max_batch_size=1)  # fmt: skip
    server = serve(naiad_server, redis_url, repo, STREAM_ONLY)
    x = digits_holdout[0]
    worker = freeze(server, x[:1], priority=1)  # a cold start takes longer than level 2 allows
    calls, acks = Calls(server), Acks(redis_url)
    http = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        calls.send("X", x[1:2])
        wait_for(lambda: pending(r, LOW) == 1, 10, "the frozen worker's claim")
        calls.send("D", x[2:3], priority=1)
        d_sent = time.monotonic()
        for timeout_us, within_s in ((100_000, (0.1, 2.0)), (5_000_000, (2.0, 5.0))):
            started = time.monotonic()
            with pytest.raises(Exception, match="Request timeout expired") as caught:
                http.infer("digits", http_inputs(x[3:4]), timeout=timeout_us)
            assert within_s[0] <= time.monotonic() - started < within_s[1], timeout_us
            assert caught.value.status() == "503"
        with pytest.raises(grpcclient.InferenceServerException, match="Request timeout expired") as caught:
            calls.client.infer("digits", grpc_inputs(x[3:4]), timeout=100_000, client_timeout=10)
        assert caught.value.status() == "StatusCode.UNAVAILABLE"
        assert r.xlen(LOW) == 1  # only X: the refused ones left nothing behind
        time.sleep(max(0.0, 1.1 - (time.monotonic() - d_sent)))  # D waits past its 1 s
        calls.send("N", x[4:5], priority=1)
        wait_for(lambda: r.xlen(HIGH) == 2, 10, "D and N queued")
        acks.remember(r, LOW, HIGH)
    finally:
        worker.send_signal(signal.SIGCONT)
    http.close()
    calls.wait(3)
    assert acks.names(r) == ["X", "N", "D"]
    assert "Request timeout expired" in str(calls.results["X"])  # claimed: the worker rejected it
    assert not isinstance(calls.results["N"], Exception) and not isinstance(calls.results["D"], Exception)
    body = stats(server)
    assert body["inference_stats"]["fail"]["count"] == 4  # X, R1, R3 and the gRPC one: REJECTED
    metrics = server.metrics()
    assert re.search(r'nv_inference_request_failure\{[^}]*reason="REJECTED"[^}]*\} 4', metrics)


def test_preferred_sizes_show_in_batch_stats_and_rows_go_back_to_their_requests(
    r, redis_url, naiad_server, example_repository, tmp_path, digits_holdout, digits_onnx
):
    """``preferred_batch_size: [4, 8]``, no delay, ``preserve_ordering``: requests of 1 to 3
    rows queued behind the frozen worker form, once it resumes, exactly the batches Triton's
    rule forms (:func:`workers.batching.next_batch`), which ``batch_stats`` counts; each
    request gets its own rows back; the worker answers in arrival order. (The release order
    ``preserve_ordering`` adds across workers is tested in tests/gateway/test_queue_placement.py:
    answers a few ms apart can reach different gRPC calls in either order.)"""
    repo = repository(tmp_path, example_repository, "preferred_batch_size: [4, 8] preserve_ordering: true")
    server = serve(naiad_server, redis_url, repo)
    x, _ = digits_holdout
    sizes = [1, 1, 2, 1, 3, 1, 1, 2, 1, 1, 3, 2, 1, 1]
    starts = np.cumsum([0, *sizes])
    before = stats(server)
    worker = freeze(server, x[:1])
    calls, acks = Calls(server), Acks(redis_url)
    stream = keys.request_stream("digits")
    try:
        for index, (size, start) in enumerate(zip(sizes, starts, strict=False)):
            calls.send(f"q{index}", x[start : start + size])
            wait_for(lambda n=index + 1: r.xlen(stream) == n, 10, f"request {index} queued")  # in order
        assert pending(r, stream) == 1  # the frozen worker claimed the first
        acks.remember(r, stream)
    finally:
        worker.send_signal(signal.SIGCONT)
    calls.wait(len(sizes))
    assert acks.names(r) == [f"q{i}" for i in range(len(sizes))]  # batches answered in arrival order
    for index, (size, start) in enumerate(zip(sizes, starts, strict=False)):
        result = calls.results[f"q{index}"]
        assert not isinstance(result, Exception), result
        own = digits_onnx.run(["label"], {"input": x[start : start + size]})[0]
        np.testing.assert_array_equal(result.as_numpy("label"), own)
    expected = [sizes[0], *_batches(sizes[1:], 64, (4, 8))]  # the claimed one ran alone
    after = stats(server)
    assert after["execution_count"] - before["execution_count"] == len(expected) + 1  # + the warm-up
    assert after["inference_count"] - before["inference_count"] == sum(sizes) + 1
    counts = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    old = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    grown = {size: counts[size] - old.get(size, 0) for size in counts if counts[size] != old.get(size, 0)}
    want: dict[int, int] = {}
    for rows in [1, *expected]:
        want[rows] = want.get(rows, 0) + 1
    assert grown == want
    assert 4 in grown and 8 in grown  # the preferred sizes were formed


def _batches(sizes: list[int], max_rows: int, preferred: tuple[int, ...]) -> list[int]:
    """The rows of each batch Triton's rule forms from ``sizes`` all queued at once."""
    requests = [InferRequest("digits", 1, [Tensor("input", "FP32", [n, 64], np.zeros((n, 64), np.float32))])
                for n in sizes]  # fmt: skip
    out = []
    while requests:
        indices, _ = batching.next_batch(requests, [0.0] * len(requests), max_rows, preferred)
        out.append(sum(batching.rows(requests[i]) for i in indices))
        requests = [q for i, q in enumerate(requests) if i not in indices]
    return out


def test_a_preferred_size_forms_from_requests_handed_over_one_after_another(
    r, redis_url, naiad_server, example_repository, tmp_path, digits_holdout, digits_onnx
):
    """``preferred_batch_size: [4]``, a 5 s delay, direct hand-off on: the idle worker takes one
    request by its gateway's socket while its blocking claim is out, then three more come by
    the socket too (its offer is for a batch, and none of the gateway's requests is in the
    stream): the four run at once as one batch of 4, not the first alone after the delay and
    the three after another (the differential suite's
    ``test_dynamic_batcher_sends_a_preferred_size_at_once`` saw that now and then)."""
    batching = "preferred_batch_size: [4] max_queue_delay_microseconds: 5000000"
    server = serve(naiad_server, redis_url, repository(tmp_path, example_repository, batching))
    x, _ = digits_holdout
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    for _ in range(3):  # four rows: run at once; the last answer carries the worker's offer
        client.infer("digits", http_inputs(x[:4]))
    client.close()
    before, added = stats(server), r.info("commandstats").get("cmdstat_xadd", {}).get("calls", 0)
    calls = Calls(server)  # right after an answer: the worker's new blocking claim is out
    calls.send("handed", x[:1])
    time.sleep(0.3)
    for i in range(3):
        calls.send(f"queued{i}", x[1 + i : 2 + i])
    calls.wait(4)
    assert r.info("commandstats").get("cmdstat_xadd", {}).get("calls", 0) == added  # all handed over
    want = digits_onnx.run(["label"], {"input": x[:4]})[0]
    for i, name in enumerate(["handed", "queued0", "queued1", "queued2"]):
        np.testing.assert_array_equal(calls.results[name].as_numpy("label"), want[i : i + 1])
    after = stats(server)
    counts = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    old = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    assert {n: c - old.get(n, 0) for n, c in counts.items() if c != old.get(n, 0)} == {4: 1}
