"""The worker's parts on their own, against a private redis-server and the example ``digits``
model (ONNX Runtime): running a batch (:mod:`workers.execution`), the reply pipeline with the
next claim (:mod:`workers.replies`) and the registry watch (:mod:`workers.lifecycle`)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from naiad import keys
from naiad.codec import QueuedRequest, decode_replies, encode_request
from naiad.inference import InferRequest, RequestedOutput, Tensor
from naiad.redis_client import connect
from naiad.registry import ModelEntry
from naiad.settings import Settings
from repository_store import index_repository, open_store
from workers.execution import BatchExecutor
from workers.lifecycle import Lifecycle
from workers.loader import VersionLoader
from workers.queue_reader import QueueReader
from workers.replies import ReplySender

MODEL = "digits"


def queued(rows: np.ndarray, queue_id: str, reply_to: str = "naiad:reply:test") -> QueuedRequest:
    request = InferRequest(MODEL, 1, [Tensor("input", "FP32", list(rows.shape), rows)],
                           outputs=[RequestedOutput("label")])  # fmt: skip
    now = time.time()
    return QueuedRequest(queue_id, request, reply_to, now + 30, now)


def entry(example_repository) -> ModelEntry:
    return index_repository(open_store(str(example_repository)))[MODEL]


@pytest.fixture
def settings(example_repository, tmp_path) -> Settings:
    return Settings(model_repository=str(example_repository), cache_dir=tmp_path / "cache")


def run(scenario):
    return asyncio.run(scenario())


def test_a_batch_is_merged_run_split_and_timed(settings, example_repository, digits_holdout, digits_onnx):
    """Three requests of 1, 2 and 3 rows in one batch: each gets its own rows' labels back,
    the statistics count one execution of 6 rows, a queue time per request and the three
    compute phases; a bad request in the batch fails the batch, not the worker."""
    x = digits_holdout[0][:6]
    expected = digits_onnx.run(["label"], {"input": x})[0]

    async def scenario():
        loader = VersionLoader(settings, MODEL)
        await loader.start(entry(example_repository))
        executor = BatchExecutor(MODEL, loader)
        group = [queued(x[:1], "a"), queued(x[1:3], "b"), queued(x[3:6], "c")]
        payloads, run_stats = await executor.execute(group)
        bad = queued(np.zeros((1, 3), np.float32), "d")  # 3 pixels, not 64: the backend refuses
        bad_payloads, bad_stats = await executor.execute([bad])
        loader.close()
        return payloads, run_stats, bad_payloads, bad_stats

    payloads, run_stats, bad_payloads, bad_stats = run(scenario)
    replies = [decode_replies(p)[0] for p in payloads]
    assert [r.queue_id for r in replies] == ["a", "b", "c"]
    labels = np.concatenate([r.outputs[0].data for r in replies])
    np.testing.assert_array_equal(labels, expected)
    assert run_stats.rows == 6 and len(run_stats.queue_ns) == 3
    assert set(run_stats.phases_ns) == {"compute_input", "compute_infer", "compute_output"}
    assert all(ns >= 0 for ns in run_stats.phases_ns.values())
    [failed] = decode_replies(bad_payloads[0])
    assert bad_stats is None and failed.error is not None and failed.queue_id == "d"


def test_a_batch_runs_within_the_callers_turn_as_it_runs_awaited_when_nothing_needs_awaiting(
    settings, example_repository, digits_holdout, digits_onnx
):
    """BatchExecutor.execute_now (a lone request answered within the turn it arrives in,
    workers.worker): the same replies and statistics as ``execute``. ``runnable_now`` gives
    no runner for a version not loaded, nor for a batch size never timed (it would first run
    in the model's thread); a batch that fails is answered with its error, not raised."""
    x = digits_holdout[0][:3]
    expected = digits_onnx.run(["label"], {"input": x})[0]

    async def scenario():
        loader = VersionLoader(settings, MODEL)
        executor = BatchExecutor(MODEL, loader)
        assert executor.runnable_now(1, 64) is None  # not loaded
        await loader.start(entry(example_repository))
        assert executor.runnable_now(1, 64) is None  # loaded, never timed
        awaited = await executor.execute([queued(x[:1], "a")])
        runner = executor.runnable_now(1, 64)
        assert runner is not None and executor.runnable_now(2, 64) is None  # version 2: none
        now = executor.execute_now(runner, [queued(x[1:3], "b")])
        failed = executor.execute_now(runner, [queued(np.zeros((1, 3), np.float32), "c")])
        loader.close()
        return awaited, now, failed

    (awaited, awaited_stats), (now, now_stats), (failed, failed_stats) = run(scenario)
    replies = [decode_replies(p)[0] for p in (*awaited, *now)]
    assert [r.queue_id for r in replies] == ["a", "b"]
    np.testing.assert_array_equal(np.concatenate([r.outputs[0].data for r in replies]), expected)
    assert (awaited_stats.rows, now_stats.rows) == (1, 2) and len(now_stats.queue_ns) == 1
    assert set(now_stats.phases_ns) == set(awaited_stats.phases_ns) == {"compute_input", "compute_infer",
                                                                        "compute_output"}  # fmt: skip
    assert set(replies[1].timings_ns) == {"compute_input", "compute_infer"}
    [error] = decode_replies(failed[0])
    assert failed_stats is None and error.error is not None and error.queue_id == "c"


def test_the_reply_pipeline_answers_acknowledges_and_claims(redis_url, settings):
    """Replies for two gateways land on their own lists, concatenated per gateway, with a TTL;
    the entries are acknowledged and deleted; the claim sent last brings the next request."""
    stream = keys.request_stream(MODEL)

    async def scenario():
        redis = connect(redis_url, longest_block_s=1.0)
        await redis.delete(stream, "naiad:reply:g1", "naiad:reply:g2")
        reader = QueueReader(redis, MODEL, "w1")
        await reader.ensure_groups()
        now = time.time()
        for queue_id, gateway in (("a", "g1"), ("b", "g2"), ("c", "g1")):
            fields = encode_request(queue_id, queued(np.ones((1, 64), np.float32), queue_id).request,
                                    f"naiad:reply:{gateway}", now + 30, now)  # fmt: skip
            await redis.xadd(stream, fields)
        claimed = await reader.read(3, None)
        fields = encode_request("next", claimed[0].request, "naiad:reply:g1", now + 30, now)
        await redis.xadd(stream, fields)  # waits for the claim that goes with the replies
        sender = ReplySender(redis, MODEL, reader, VersionLoader(settings, MODEL))
        pairs = [(q, f"reply-{q.queue_id}".encode()) for q in claimed]
        got = await sender.send(pairs, claim=(4, None))
        lists = {g: await redis.lrange(f"naiad:reply:{g}", 0, -1) for g in ("g1", "g2")}
        ttl = await redis.ttl("naiad:reply:g1")
        left = await redis.xlen(stream)
        await redis.aclose()
        return got, lists, ttl, left

    got, lists, ttl, left = run(scenario)
    assert lists == {"g1": [b"reply-areply-c"], "g2": [b"reply-b"]}
    assert 0 < ttl <= keys.REPLY_TTL_S
    requests, sent = got
    assert [q.queue_id for q in requests] == ["next"] and sent <= time.monotonic()
    assert left == 1  # the three answered entries deleted; the claimed one stays until answered


def test_the_registry_watch_drains_on_a_new_config_and_retires_on_new_versions(
    redis_url, settings, example_repository
):
    """A changed config makes the worker outdated (drain now); only new versions make it
    superseded (serve the old queue, then retire); an unchanged generation costs one GET."""
    loaded = entry(example_repository)

    async def scenario():
        redis = connect(redis_url, longest_block_s=1.0)
        await redis.hset(keys.REGISTRY, MODEL, loaded.to_bytes())
        await redis.incr(keys.REGISTRY_GENERATION)
        loader = VersionLoader(settings, MODEL)
        await loader.start(loaded)
        stopping = asyncio.Event()
        life = Lifecycle(settings, redis, MODEL, "w1", QueueReader(redis, MODEL, "w1"), loader, stopping)
        assert await life.registered() == loaded
        steps = [await life.outdated()]  # nothing changed
        newer = ModelEntry(MODEL, loaded.config, [*loaded.versions, 99], "READY")
        await redis.hset(keys.REGISTRY, MODEL, newer.to_bytes())
        await redis.incr(keys.REGISTRY_GENERATION)
        steps += [await life.outdated(), life.superseded, life.retired()]
        changed = loaded.config.__class__()
        changed.CopyFrom(loaded.config)
        changed.max_batch_size = 8
        reconfigured = ModelEntry(MODEL, changed, loaded.versions, "READY")
        await redis.hset(keys.REGISTRY, MODEL, reconfigured.to_bytes())
        await redis.incr(keys.REGISTRY_GENERATION)
        steps.append(await life.outdated())
        loader.close()
        await redis.aclose()
        return steps

    assert run(scenario) == [False, False, True, False, True]


def test_replies_go_direct_to_a_gateway_on_this_machine_and_through_redis_otherwise(redis_url, settings):
    """Gateway g1 has a direct reply channel (naiad.reply_channel), g2 names a socket that is
    gone. A batch answering g1 alone goes on g1's socket with its statistics (nothing on its
    list, nothing counted in Redis); one answering g2 alone goes on g2's Redis list; one
    answering both goes through Redis entirely, statistics included (a client of either may
    read them once it has its answer)."""
    from naiad import stats  # noqa: PLC0415
    from naiad.reply_channel import ReplyServer, decode_executions  # noqa: PLC0415

    stream = keys.request_stream(MODEL)
    got_replies: list[bytes] = []
    recorded: list[tuple[str, list[stats.Execution]]] = []

    async def counted(redis) -> int:
        return int(await redis.hget(keys.stats(MODEL), "1:execution_count") or 0)

    async def scenario():
        redis = connect(redis_url, longest_block_s=1.0)
        await redis.delete(stream, "naiad:reply:g1", "naiad:reply:g2", keys.stats(MODEL))
        server = ReplyServer(got_replies.append, lambda raw: recorded.append(decode_executions(raw)))
        await server.start()
        gone = (server.path + ".gone", server.token)
        reader = QueueReader(redis, MODEL, "w1")
        await reader.ensure_groups()
        now = time.time()
        for queue_id, gateway, address in (("a", "g1", server.address), ("b", "g2", gone),
                                           ("c", "g1", server.address)):  # fmt: skip
            request = queued(np.ones((1, 64), np.float32), queue_id).request
            fields = encode_request(queue_id, request, f"naiad:reply:{gateway}", now + 30, now,
                                    reply_address=address)  # fmt: skip
            await redis.xadd(stream, fields)
        a, b, c = await reader.read(3, None)
        assert [q.reply_address for q in (a, b, c)] == [server.address, gone, server.address]
        sender = ReplySender(redis, MODEL, reader, VersionLoader(settings, MODEL))
        run_ = stats.Execution(1, 2, [10, 30], {"compute_infer": 5}, 1000)
        await sender.send([(a, b"reply-a"), (c, b"reply-c")], [run_])
        after_direct = await counted(redis)
        await sender.send([(b, b"reply-b")], [run_])
        await sender.send([(a, b"both-a"), (b, b"both-b")], [run_])
        for _ in range(100):
            if got_replies:
                break
            await asyncio.sleep(0.01)
        lists = {g: await redis.lrange(f"naiad:reply:{g}", 0, -1) for g in ("g1", "g2")}
        in_redis = await counted(redis)
        await server.close()
        await redis.aclose()
        return lists, after_direct, in_redis, run_

    lists, after_direct, in_redis, run_ = run(scenario)
    assert got_replies == [b"reply-areply-c"]
    assert recorded == [(MODEL, [run_])] and after_direct == 0  # counted once, by g1
    assert lists == {"g1": [b"both-a"], "g2": [b"reply-b", b"both-b"]}
    assert in_redis == 2  # the batches answered through Redis count there


def test_a_reply_connection_without_the_token_is_closed_and_delivers_nothing():
    """Anyone on the machine who can reach the socket but lacks the token (it travels only in
    Redis entries) cannot inject replies."""
    from naiad.reply_channel import FRAME, ReplyServer  # noqa: PLC0415

    delivered: list[bytes] = []

    async def scenario():
        server = ReplyServer(delivered.append, lambda raw: None)
        await server.start()
        reader, writer = await asyncio.open_unix_connection(server.path)
        writer.write(FRAME.pack(0, 5) + b"wrong" + FRAME.pack(0, 4) + b"fake")
        closed = await asyncio.wait_for(reader.read(), 2)  # EOF: the server closed it
        writer.close()
        await server.close()
        return closed

    assert run(scenario) == b"" and delivered == []


def test_the_reply_socket_bounds_what_an_untrusted_or_broken_peer_can_make_it_hold(monkeypatch, tmp_path):
    """Before its token a connection may send only the token's frame (a header claiming
    gigabytes closes it at once, nothing buffered), and it has ``TOKEN_TIMEOUT_S`` to send
    it; malformed statistics from a trusted peer are handed on as sent (the queue client's
    recording drops them: tests/naiad/test_hand_off_channel.py) and its replies still
    delivered; a socket path too long fails the start with nothing left behind; a killed
    gateway's folder is removed by the next start, a live one's is not."""
    import os  # noqa: PLC0415

    from naiad import reply_channel  # noqa: PLC0415
    from naiad.reply_channel import FRAME, ReplyServer  # noqa: PLC0415

    monkeypatch.setattr(reply_channel, "TOKEN_TIMEOUT_S", 0.2)
    delivered, recorded = [], []

    async def scenario():
        server = ReplyServer(delivered.append, recorded.append)
        await server.start()
        results = []
        for first in (FRAME.pack(0, 1 << 31) + b"x" * 65536, b""):  # a 2 GiB claim; silence
            reader, writer = await asyncio.open_unix_connection(server.path)
            writer.write(first)
            results.append(await asyncio.wait_for(reader.read(), 2))  # EOF: closed
            writer.close()
        reader, writer = await asyncio.open_unix_connection(server.path)
        token = server.token.encode()
        bad = reply_channel.msgpack.packb(["digits", [[1, 1, [10], {"compute_infer": "x"}, 5]]])
        writer.write(FRAME.pack(0, len(token)) + token + FRAME.pack(len(bad), 3) + bad + b"abc")
        for _ in range(100):
            if delivered:
                break
            await asyncio.sleep(0.01)
        writer.close()
        await server.close()
        return results, os.path.exists(server.path), bad

    results, left, bad = run(scenario)
    assert results == [b"", b""] and not left
    assert delivered == [b"abc"] and recorded == [bad]
    for malformed in ([1, 1, [10], {"compute_infer": float("inf")}, 5], [1, 1, [10], {"nope": 1}, 5],
                      [1, 1, "x", {}, 5], [1, -1000000, [], {}, 0],  # a negative count
                      [1, 2**63 - 1, [2**63 - 1], {}, 2**63 - 1]):  # past Redis's 64-bit sums  # fmt: skip
        with pytest.raises(ValueError):
            reply_channel.decode_executions(reply_channel.msgpack.packb(["digits", [malformed]]))

    long_dir = tmp_path / ("d" * 120)
    long_dir.mkdir()
    monkeypatch.setenv("TMPDIR", str(long_dir))
    monkeypatch.setattr(reply_channel.tempfile, "tempdir", None)

    async def too_long():
        with pytest.raises(OSError):
            await ReplyServer(delivered.append, recorded.append).start()

    run(too_long)
    assert os.listdir(long_dir) == []

    monkeypatch.setattr(reply_channel.tempfile, "tempdir", str(tmp_path))
    stale = tmp_path / "naiad-replies-killed"
    stale.mkdir()
    os.utime(stale, (1, 1))

    async def live_and_stale():
        live = ReplyServer(delivered.append, recorded.append)
        await live.start()
        os.utime(os.path.dirname(live.path), (1, 1))
        another = ReplyServer(delivered.append, recorded.append)
        await another.start()  # sweeps: the killed one's folder goes, the live one's stays
        kept = os.path.exists(live.path)
        await another.close()
        await live.close()
        return kept

    assert run(live_and_stale) and not stale.exists()
