"""The response cache on a real Redis: canonical keys, hits, eviction at the size cap, and
coalescing of identical requests (one run for K callers; a failing or dead leader never leaves
its followers hanging). The ``run`` callables stand in for the queue: they count calls."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

from gateway.http_codec import parse_infer_request
from gateway.response_cache import CacheConfig, CacheTrace, ResponseCache, request_digest
from naiad import keys
from naiad.errors import DeadlineExceeded, InferenceFailed, InvalidInput
from naiad.inference import InferRequest, InferResponse, RequestedOutput, Tensor
from naiad.redis_client import connect

MODEL = "m"


def request(value: float = 1.0, request_id: str = "", **parameters) -> InferRequest:
    data = np.full((1, 4), value, np.float32)
    return InferRequest(MODEL, 1, [Tensor("input", "FP32", [1, 4], data)], [], request_id, parameters)


class Runner:
    """A stand-in for the queue: answers ``outputs`` (input * 2), optionally after ``gate``
    opens, raising ``errors`` in turn first. ``calls`` counts runs."""

    def __init__(self, req: InferRequest, gate: asyncio.Event | None = None, errors=()):
        self.req, self.gate, self.errors, self.calls = req, gate, list(errors), 0

    async def __call__(self, timeout_s: float) -> InferResponse:
        assert timeout_s > 0
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.errors:
            raise self.errors.pop(0)
        out = Tensor("out", "FP32", [1, 4], self.req.inputs[0].data * 2)
        return InferResponse(self.req.model, self.req.version, [out], self.req.id)


def scenario(redis_url: str, body, config: CacheConfig | None = None) -> None:
    """Run ``body(cache, redis)`` with a cache on fresh clients, closed whatever happens."""

    async def main() -> None:
        redis, blocking = connect(redis_url), connect(redis_url, longest_block_s=2)
        try:
            await body(ResponseCache(redis, blocking, config or CacheConfig()), redis)
        finally:
            await redis.aclose()
            await blocking.aclose()

    asyncio.run(asyncio.wait_for(main(), 60))


async def infer(cache: ResponseCache, req: InferRequest, run, timeout_s: float = 10.0):
    trace = CacheTrace()
    response = await cache.infer(req, timeout_s, run, trace)
    return response, trace


# --- keys ------------------------------------------------------------------------------------


def test_a_json_and_a_binary_request_with_the_same_tensor_share_a_key() -> None:
    x = np.arange(64, dtype=np.float32).reshape(1, 64) % 17
    inputs = [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": x.ravel().tolist()}]
    as_json = json.dumps({"inputs": inputs, "outputs": [{"name": "label"}]}).encode()
    head = json.dumps({
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "label", "parameters": {"binary_data": True}}],
        "parameters": {"binary_data_output": True, "timeout": 5_000_000, "priority": 1},
    }).encode()  # fmt: skip
    json_req = parse_infer_request(as_json, None, "digits", 1)
    binary_req = parse_infer_request(head + x.tobytes(), len(head), "digits", 1)
    assert request_digest(json_req) == request_digest(binary_req)


def test_what_changes_the_key() -> None:
    base = request_digest(request())
    assert request_digest(request(timeout=100, priority=2, binary_data_output=True)) == base
    changed = [
        request(2.0),  # the tensor's bytes
        request(custom="x"),  # a parameter that may change results
        InferRequest(MODEL, 2, request().inputs),  # the resolved version
        InferRequest("other", 1, request().inputs),  # the model
        InferRequest(MODEL, 1, request().inputs, [RequestedOutput("out")]),
        InferRequest(MODEL, 1, request().inputs, [RequestedOutput("out", class_count=3)]),
    ]
    digests = {request_digest(r) for r in changed}
    assert base not in digests and len(digests) == len(changed)
    two = [Tensor(name, "INT32", [1], np.array([i], np.int32)) for i, name in enumerate("ab")]
    assert request_digest(InferRequest(MODEL, 1, two)) == request_digest(InferRequest(MODEL, 1, two[::-1]))


# --- hits and stores -------------------------------------------------------------------------


def test_a_hit_runs_nothing_and_echoes_the_new_id(redis_url: str) -> None:
    async def body(cache: ResponseCache, redis) -> None:
        first, run = request(request_id="a"), Runner(request(request_id="a"))
        response, trace = await infer(cache, first, run)
        assert (trace.used, trace.hit, run.calls, response.id) == (True, False, 1, "a")
        again, trace = await infer(cache, request(request_id="b", timeout=7), run)
        assert (trace.hit, run.calls, again.id) == (True, 1, "b")
        np.testing.assert_array_equal(again.outputs[0].data, response.outputs[0].data)
        assert trace.ns > 0
        other_version = InferRequest(MODEL, 2, request().inputs)
        _, trace = await infer(cache, other_version, Runner(other_version))
        assert not trace.hit  # a new version never serves the old version's entry

    scenario(redis_url, body)


def test_only_successes_are_stored(redis_url: str) -> None:
    async def body(cache: ResponseCache, redis) -> None:
        run = Runner(request(), errors=[InferenceFailed("boom")])
        with pytest.raises(InferenceFailed):
            await infer(cache, request(), run)
        _, trace = await infer(cache, request(), run)
        assert (trace.hit, run.calls) == (False, 2)
        _, trace = await infer(cache, request(), run)
        assert (trace.hit, run.calls) == (True, 2)

    scenario(redis_url, body)


def test_the_size_cap_evicts_the_least_recently_used(redis_url: str) -> None:
    cap = 1000

    async def body(cache: ResponseCache, redis) -> None:
        reqs = [request(float(i)) for i in range(40)]
        for req in reqs[:3]:
            await infer(cache, req, Runner(req))
        (_, trace) = await infer(cache, reqs[0], Runner(reqs[0]))
        assert trace.hit  # reqs[0] is now the most recently used of the first three
        for req in reqs[3:]:
            await infer(cache, req, Runner(req))
        total = int(await redis.get(keys.RESPONSE_CACHE_BYTES))
        entries = await redis.keys(keys.response_cache_entry(MODEL, "*"))
        stored = [await redis.strlen(entry) for entry in entries]
        assert 0 < total <= cap and sum(stored) <= total
        assert len(entries) == await redis.zcard(keys.RESPONSE_CACHE_LRU) < len(reqs)
        assert await cache.lookup(MODEL, request_digest(reqs[1])) is None  # evicted, oldest
        assert await cache.lookup(MODEL, request_digest(reqs[-1])) is not None

    scenario(redis_url, body, CacheConfig(max_bytes=cap))


def test_an_entry_over_the_cap_is_not_stored_and_entries_expire(redis_url: str) -> None:
    async def body(cache: ResponseCache, redis) -> None:
        _, trace = await infer(cache, request(), Runner(request()))
        assert not trace.hit and await redis.zcard(keys.RESPONSE_CACHE_LRU) == 0

    scenario(redis_url, body, CacheConfig(max_bytes=10))

    async def expiring(cache: ResponseCache, redis) -> None:
        await infer(cache, request(), Runner(request()))
        assert 0 < await redis.pttl(keys.response_cache_entry(MODEL, request_digest(request()))) <= 200
        await asyncio.sleep(0.3)
        _, trace = await infer(cache, request(), Runner(request()))
        assert not trace.hit

    scenario(redis_url, expiring, CacheConfig(ttl_s=0.2))


# --- coalescing ------------------------------------------------------------------------------


async def _followers_joined(redis, req: InferRequest, count: int) -> None:
    """Wait until ``count`` followers joined the current leader's round."""
    digest = request_digest(req)
    while True:
        token = await redis.get(keys.response_cache_inflight(MODEL, digest))
        if token is not None:
            joined = await redis.get(keys.response_cache_waiters(MODEL, digest, token.decode()))
            if joined is not None and int(joined) >= count:
                return
        await asyncio.sleep(0.01)


def test_identical_concurrent_requests_run_once(redis_url: str) -> None:
    k = 8

    async def body(cache: ResponseCache, redis) -> None:
        gate = asyncio.Event()
        run = Runner(request(), gate)
        tasks = [asyncio.create_task(infer(cache, request(request_id=str(i)), run)) for i in range(k)]
        await _followers_joined(redis, request(), k - 1)
        gate.set()
        results = await asyncio.gather(*tasks)
        assert run.calls == 1
        assert all(r.id == str(i) for i, (r, t) in enumerate(results) if t.hit)  # ids echoed
        assert sorted(t.hit for _, t in results) == [False] + [True] * (k - 1)

    scenario(redis_url, body)


def test_a_leader_failing_on_its_own_account_lets_a_follower_run(redis_url: str) -> None:
    async def body(cache: ResponseCache, redis) -> None:
        gate = asyncio.Event()
        run = Runner(request(), gate, errors=[DeadlineExceeded("the leader's own deadline")])
        leader = asyncio.create_task(infer(cache, request(request_id="leader"), run))
        await asyncio.sleep(0.05)  # the leader holds the lease
        followers = [asyncio.create_task(infer(cache, request(request_id=str(i)), run)) for i in range(3)]
        await _followers_joined(redis, request(), 3)
        gate.set()
        with pytest.raises(DeadlineExceeded):
            await leader
        results = await asyncio.gather(*followers)
        assert run.calls == 2  # the failed leader, then one new leader for all three
        assert all(r.outputs[0].data.tolist() == [[2.0] * 4] for r, _ in results)

    scenario(redis_url, body)


def test_a_leader_failing_in_the_model_forwards_its_error(redis_url: str) -> None:
    async def body(cache: ResponseCache, redis) -> None:
        gate = asyncio.Event()
        run = Runner(request(), gate, errors=[InferenceFailed("the model raised")])
        tasks = [asyncio.create_task(infer(cache, request(), run)) for _ in range(4)]
        await _followers_joined(redis, request(), 3)
        gate.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert run.calls == 1
        assert all(isinstance(o, InferenceFailed) and o.message == "the model raised" for o in outcomes)

    scenario(redis_url, body)


def test_a_dead_leader_is_replaced_within_its_lease(redis_url: str) -> None:
    async def body(cache: ResponseCache, redis) -> None:
        digest = request_digest(request())
        # A leader that took the lease and died: nobody renews it, nobody will notify.
        await redis.set(keys.response_cache_inflight(MODEL, digest), "dead", px=500)
        run = Runner(request())
        started = time.monotonic()
        response, trace = await infer(cache, request(), run, timeout_s=20)
        assert run.calls == 1 and not trace.hit and response.outputs
        assert time.monotonic() - started < 5

    scenario(redis_url, body)


def test_a_follower_never_waits_past_its_deadline(redis_url: str) -> None:
    async def body(cache: ResponseCache, redis) -> None:
        gate = asyncio.Event()
        run = Runner(request(), gate)
        leader = asyncio.create_task(infer(cache, request(), run))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await infer(cache, request(), run, timeout_s=0.3)
        assert time.monotonic() - started < 2
        gate.set()
        await leader

    scenario(redis_url, body)


@pytest.mark.parametrize("value", [2**64, "\ud800"])
def test_parameters_msgpack_cannot_encode_are_a_400_as_when_queued(value):
    """JSON allows both; msgpack refuses them: the same InvalidInput as queueing gives
    (naiad.codec.pack_request_values), not a 500 from the cache's key."""
    with pytest.raises(InvalidInput, match="request parameters cannot be encoded"):
        request_digest(request(custom=value))
