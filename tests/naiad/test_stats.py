"""naiad.stats against a real redis-server: counters added in pipelines, read back in Triton's
statistics shape, the same for any reader."""

from __future__ import annotations

import asyncio

from gateway.grpc_codec import to_model_statistics
from naiad import keys, stats
from naiad.redis_client import connect


async def _record(url: str) -> None:
    redis = connect(url)
    try:
        async with redis.pipeline(transaction=False) as pipe:
            stats.add_execution(pipe, "m", stats.Execution(1, 3, [10, 20], _phases(5, 7, 11), 1000))
            stats.add_execution(pipe, "m", stats.Execution(1, 1, [30], _phases(1, 2, 3), 2000))
            stats.add_execution(pipe, "m", stats.Execution(2, 4, [40], _phases(1, 1, 1), 3000))
            stats.add_requests(pipe, "m", 1, True, [100], 1000)
            stats.add_requests(pipe, "m", 1, True, [200], 2000)
            stats.add_requests(pipe, "m", 1, True, [300], 2000)
            stats.add_requests(pipe, "m", 1, False, [50], 2500)
            await pipe.execute()
    finally:
        await redis.aclose()


def _phases(compute_input: int, compute_infer: int, compute_output: int) -> dict[str, int]:
    return {"compute_input": compute_input, "compute_infer": compute_infer, "compute_output": compute_output}


async def _read(url: str, wanted) -> list[dict]:
    redis = connect(url)
    try:
        return await stats.read(redis, wanted)
    finally:
        await redis.aclose()


def test_counters_add_up_per_version_and_batch_size(redis_url):
    asyncio.run(_record(redis_url))
    v1, v2 = asyncio.run(_read(redis_url, [("m", [1, 2])]))
    assert (v1["name"], v1["version"]) == ("m", "1")
    assert v1["inference_count"] == 4 and v1["execution_count"] == 2
    assert v1["last_inference"] == 2500  # the failure came last
    inference = v1["inference_stats"]
    assert inference["success"] == {"count": 3, "ns": 600}
    assert inference["fail"] == {"count": 1, "ns": 50}
    assert inference["queue"] == {"count": 3, "ns": 60}
    # Each request of a batch is charged the batch's phase durations, as Triton does.
    assert inference["compute_input"] == {"count": 3, "ns": 5 * 2 + 1}
    assert inference["compute_infer"] == {"count": 3, "ns": 7 * 2 + 2}
    assert inference["compute_output"] == {"count": 3, "ns": 11 * 2 + 3}
    assert inference["cache_hit"] == inference["cache_miss"] == {"count": 0, "ns": 0}
    assert v1["batch_stats"] == [
        {"batch_size": 1, "compute_input": {"count": 1, "ns": 1}, "compute_infer": {"count": 1, "ns": 2},
         "compute_output": {"count": 1, "ns": 3}},
        {"batch_size": 3, "compute_input": {"count": 1, "ns": 5}, "compute_infer": {"count": 1, "ns": 7},
         "compute_output": {"count": 1, "ns": 11}},
    ]  # fmt: skip
    assert v2["inference_count"] == 4 and v2["execution_count"] == 1
    assert [b["batch_size"] for b in v2["batch_stats"]] == [4]
    assert v2["inference_stats"]["success"] == {"count": 0, "ns": 0}


def test_unrecorded_model_reads_as_zeros_in_full_shape(redis_url):
    (stat,) = asyncio.run(_read(redis_url, [("never", [3])]))
    assert stat["version"] == "3" and stat["last_inference"] == 0
    assert stat["inference_count"] == stat["execution_count"] == 0
    assert list(stat["inference_stats"]) == list(stats.DURATIONS)
    assert all(d == {"count": 0, "ns": 0} for d in stat["inference_stats"].values())
    assert stat["batch_stats"] == []


def test_key_layout_is_one_hash_per_model_with_hash_tag(redis_url):
    asyncio.run(_record(redis_url))

    async def fields() -> set[str]:
        redis = connect(redis_url)
        try:
            assert await redis.keys("naiad:*") == [keys.stats("m").encode()]
            return {f.decode() for f in await redis.hkeys(keys.stats("m"))}
        finally:
            await redis.aclose()

    assert keys.stats("m") == "naiad:{m}:stats"
    found = asyncio.run(fields())
    assert {"1:success_count", "1:success_ns", "1:batch:3:compute_infer_ns", "1:last_inference_ms"} <= found


def test_two_readers_agree_and_grpc_message_carries_the_same_numbers(redis_url):
    asyncio.run(_record(redis_url))
    first = asyncio.run(_read(redis_url, [("m", [1, 2])]))
    second = asyncio.run(_read(redis_url, [("m", [1, 2])]))
    assert first == second
    message = to_model_statistics({"model_stats": first})
    assert [s.version for s in message.model_stats] == ["1", "2"]
    got = message.model_stats[0]
    assert got.inference_count == 4 and got.execution_count == 2 and got.last_inference == 2500
    assert got.inference_stats.success.count == 3 and got.inference_stats.success.ns == 600
    assert [b.batch_size for b in got.batch_stats] == [1, 3]
    assert got.batch_stats[1].compute_infer.ns == 7


def _adds(model: str) -> list:
    """Counters of two batches and four requests of ``model``, each a pipeline filler."""
    runs = [stats.Execution(1, 3, [10, 20], _phases(5, 7, 11), 1000),
            stats.Execution(1, 1, [30], _phases(1, 2, 3), 2000)]
    return [
        *(lambda p, run=run: stats.add_execution(p, model, run) for run in runs),
        *(lambda p, ns=ns: stats.add_requests(p, model, 1, True, [ns], 1000) for ns in (100, 200, 300)),
        lambda p: stats.add_requests(p, model, 1, False, [50], 2500, "BACKEND"),
    ]


def test_stats_writer_groups_concurrent_requests_into_the_same_counters(redis_url: str) -> None:
    """Counters recorded concurrently through :class:`StatsWriter` (grouped, summed per
    field) read back exactly as the same counters sent one pipeline each."""
    from naiad.stats_writer import StatsWriter  # noqa: PLC0415

    async def grouped() -> None:
        redis = connect(redis_url)
        try:
            writer = StatsWriter(redis)
            await asyncio.gather(*(writer.record(add) for add in _adds("g")))
        finally:
            await redis.aclose()

    async def one_by_one() -> None:
        redis = connect(redis_url)
        try:
            for add in _adds("o"):
                async with redis.pipeline(transaction=False) as pipe:
                    add(pipe)
                    await pipe.execute()
        finally:
            await redis.aclose()

    asyncio.run(grouped())
    asyncio.run(one_by_one())
    (g,), (o,) = asyncio.run(_read(redis_url, [("g", [1])])), asyncio.run(_read(redis_url, [("o", [1])]))
    assert g["inference_stats"]["success"] == {"count": 3, "ns": 600}
    assert g["execution_count"] == 2 and g["inference_stats"]["fail"] == {"count": 1, "ns": 50}
    assert {**g, "name": "o"} == o


def test_stats_writer_lingers_for_more_counters_until_a_flush(redis_url: str, monkeypatch) -> None:
    """A write waits ``LINGER_S`` after its first counters, so requests finishing one at a
    time share it; a reader's flush sends it at once (an answered client sees its counters)."""
    from naiad import stats_writer  # noqa: PLC0415

    monkeypatch.setattr(stats_writer, "LINGER_S", 30.0)

    async def run() -> tuple[int, int, dict]:
        redis = connect(redis_url)
        try:
            writer = stats_writer.StatsWriter(redis)
            before = (await redis.info("commandstats")).get("cmdstat_eval", {}).get("calls", 0)
            for add in _adds("l"):  # one a turn, as requests answered one after another
                writer.add(add)
                await asyncio.sleep(0.01)
            unflushed = await redis.exists(keys.stats("l"))
            await asyncio.wait_for(writer.flush(), 5)  # not after 30 s: the flush hurries it
            after = (await redis.info("commandstats"))["cmdstat_eval"]["calls"]
            return unflushed, after - before, (await _read(redis_url, [("l", [1])]))[0]
        finally:
            await redis.aclose()

    unflushed, evals, got = asyncio.run(run())
    assert unflushed == 0  # lingering: nothing written before the flush (exists after it: below)
    assert evals == 1  # six requests' counters, one script call
    assert got["inference_stats"]["success"] == {"count": 3, "ns": 600} and got["execution_count"] == 2


def test_a_flush_in_the_turn_of_the_first_add_does_not_wait_the_linger(redis_url: str, monkeypatch) -> None:
    """A reader's flush that comes in the loop turn that started a write (its task not run
    yet: a reply frame's statistics and a scrape read together) sends it at once too, not
    after ``LINGER_S``."""
    from naiad import stats_writer  # noqa: PLC0415

    monkeypatch.setattr(stats_writer, "LINGER_S", 30.0)

    async def run() -> dict:
        redis = connect(redis_url)
        try:
            writer = stats_writer.StatsWriter(redis)
            for add in _adds("t"):
                writer.add(add)
            async with asyncio.timeout(5):  # in this turn (wait_for would flush in a task of its own)
                await writer.flush()
            return (await _read(redis_url, [("t", [1])]))[0]
        finally:
            await redis.aclose()

    got = asyncio.run(run())
    assert got["inference_stats"]["success"] == {"count": 3, "ns": 600} and got["execution_count"] == 2


def test_a_malformed_add_is_dropped_not_the_write_nor_its_waiters(redis_url: str) -> None:
    """One add that raises (statistics that came malformed; the reply channel refuses those
    first, this is the writer's own guard) is logged and skipped: the others of its write are
    written and a flush returns."""
    from naiad.stats_writer import StatsWriter  # noqa: PLC0415

    def broken(pipe) -> None:
        stats.add_execution(pipe, "m", stats.Execution(1, 1, [10], {"compute_infer": "x"}, 5))

    async def run() -> dict:
        redis = connect(redis_url)
        try:
            writer = StatsWriter(redis)
            for add in (broken, *_adds("m")):
                writer.add(add)
            await asyncio.wait_for(writer.flush(), 5)
            return (await _read(redis_url, [("m", [1])]))[0]
        finally:
            await redis.aclose()

    got = asyncio.run(run())
    assert got["inference_stats"]["success"] == {"count": 3, "ns": 600}
    assert got["inference_stats"]["fail"] == {"count": 1, "ns": 50} and got["execution_count"] >= 2


async def _record_cache(url: str) -> None:
    redis = connect(url)
    try:
        async with redis.pipeline(transaction=False) as pipe:
            stats.add_execution(pipe, "c", stats.Execution(1, 1, [30], _phases(1, 2, 3), 1000))
            stats.add_cache(pipe, "c", 1, False, 40)
            stats.add_cache(pipe, "c", 1, True, 5)
            stats.add_cache(pipe, "c", 1, True, 7)
            await pipe.execute()
    finally:
        await redis.aclose()


def test_queue_count_includes_cache_hits(redis_url):
    """The statistics extension: the queue "count and cumulative duration includes cache
    hits"; a hit never queued, so it adds to the count and nothing to the duration."""
    asyncio.run(_record_cache(redis_url))
    (v1,) = asyncio.run(_read(redis_url, [("c", [1])]))
    inference = v1["inference_stats"]
    assert inference["queue"] == {"count": 3, "ns": 30}
    assert inference["cache_hit"] == {"count": 2, "ns": 12}
    assert inference["cache_miss"] == {"count": 1, "ns": 40}
    assert v1["execution_count"] == 1 and inference["compute_infer"]["count"] == 1
    assert v1["response_stats"] == {} and v1["memory_usage"] == []


def test_a_writers_outcomes_add_up_as_each_request_recorded_alone(redis_url):
    """StatsWriter.add_request groups a write's outcomes by model version, result and
    reason (stats.add_requests): the hash it leaves equals what each request's own
    stats.add_requests of that request alone leaves (counts, ns, duration buckets, last inference
    of failures)."""
    from naiad.stats_writer import StatsWriter  # noqa: PLC0415

    outcomes = [  # model, version, ok, duration ns, end ms, reason
        ("w", 1, True, 400_000, 10, "OTHER"), ("w", 1, True, 3_000_000, 11, "OTHER"),
        ("w", 1, True, 900_000, 12, "OTHER"), ("w", 2, True, 60_000_000_000, 13, "OTHER"),
        ("w", 1, False, 5_000, 14, "REJECTED"), ("w", 1, False, 7_000, 17, "REJECTED"),
        ("w", 1, False, 9_000, 15, "BACKEND"), ("w", 1, False, 1_000, 16, "no such reason"),
    ]  # fmt: skip

    async def scenario():
        redis = connect(redis_url)
        await redis.delete(keys.stats("w"), keys.stats("alone"))
        writer = StatsWriter(redis)
        for model, version, ok, ns, end, reason in outcomes:
            writer.add_request(model, version, ok, ns, end, reason)
        await writer.flush()
        async with redis.pipeline(transaction=False) as pipe:
            for _, version, ok, ns, end, reason in outcomes:
                stats.add_requests(pipe, "alone", version, ok, [ns], end, reason)
            await pipe.execute()
        grouped, alone = await redis.hgetall(keys.stats("w")), await redis.hgetall(keys.stats("alone"))
        await redis.aclose()
        return grouped, alone

    grouped, alone = asyncio.run(scenario())
    # each request alone leaves the last one's end (16); grouped, the version's latest (17)
    assert int(alone.pop(b"1:last_inference_ms")) == 16 and int(grouped.pop(b"1:last_inference_ms")) == 17
    assert grouped == alone
    assert int(grouped[b"1:success_count"]) == 3 and int(grouped[b"1:success_ns"]) == 4_300_000
    assert int(grouped[b"1:fail:REJECTED_count"]) == 2 and int(grouped[b"1:fail:OTHER_count"]) == 1
    assert int(grouped[b"1:duration_bucket:0.001"]) == 2 and int(grouped[b"2:duration_bucket:+Inf"]) == 1


def test_a_failure_after_a_batch_in_one_write_leaves_the_newest_last_inference(redis_url):
    """A write carries a worker's batch statistics (their last inference: the batch's end)
    and request outcomes in any order; the hash keeps the newest time it was given, not the
    one added last (review of stop 41: the grouped outcomes went first, the batch after)."""
    from naiad import reply_channel  # noqa: PLC0415
    from naiad.queue_client import _add_executions  # noqa: PLC0415
    from naiad.stats_writer import StatsWriter  # noqa: PLC0415

    async def scenario():
        redis = connect(redis_url)
        await redis.delete(keys.stats("late"))
        writer = StatsWriter(redis)
        batch = stats.Execution(1, 1, [5], {"compute_infer": 7}, 1_000)
        raw = reply_channel.encode_executions("late", [batch])
        writer.add(lambda pipe: _add_executions(pipe, raw))  # the batch ended at 1,000 ms
        writer.add_request("late", 1, True, 10, 1_000)
        writer.add_request("late", 1, False, 10, 2_000, "REJECTED")  # a failure at 2,000 ms, no batch
        writer.add(lambda pipe: _add_executions(pipe, raw))  # an older batch's statistics, last in
        await writer.flush()
        last = await redis.hget(keys.stats("late"), "1:last_inference_ms")
        await redis.aclose()
        return int(last)

    assert asyncio.run(scenario()) == 2_000
