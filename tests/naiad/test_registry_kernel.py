"""``naiad.registry`` against a private redis-server: the one reader every process uses (a
malformed entry skipped alike everywhere), the view that re-reads only when the generation
moved, the writers (publish, compare-and-set) and the version rule of a request."""

from __future__ import annotations

import asyncio

import pytest

from naiad import keys
from naiad.errors import InvalidInput, ModelNotFound, ModelNotReady
from naiad.redis_client import connect
from naiad.registry import (
    READY,
    UNAVAILABLE,
    UNLOADED,
    ModelEntry,
    RegistryReader,
    RegistryView,
    compare_and_set,
    parse_version,
    publish,
    select_version,
)
from repository_store import parse_config

CONFIG = parse_config('name: "m" backend: "onnxruntime" max_batch_size: 0', "m")


def entry(name: str = "m", versions=(1, 2), state: str = READY, **kwargs) -> ModelEntry:
    return ModelEntry(name, CONFIG, list(versions), state, **kwargs)


def run(redis_url: str, scenario):
    async def main():
        redis = connect(redis_url, longest_block_s=1.0)
        await redis.delete(keys.REGISTRY, keys.REGISTRY_GENERATION)
        try:
            return await scenario(redis)
        finally:
            await redis.aclose()

    return asyncio.run(main())


def test_publish_then_every_reader_sees_the_same_entries(redis_url: str) -> None:
    async def scenario(redis):
        reader = RegistryReader(redis)
        async with redis.pipeline(transaction=True) as pipe:
            publish(pipe, {"m": entry(), "n": entry("n")})
            *_, generation = await pipe.execute()
        placeholders = {name: ModelEntry(name, None, reason=UNLOADED) for name in ("m", "o")}
        async with redis.pipeline(transaction=True) as pipe:  # removes n; m keeps its entry
            publish(pipe, {}, ["n"], unless_present=placeholders)
            await pipe.execute()
        return generation, await reader.read_all(), await reader.generation(), await reader.names()

    generation, entries, now, names = run(redis_url, scenario)
    assert generation == 1 and now == 2 and names == {"m", "o"}
    assert entries["m"] == entry() and entries["o"].reason == UNLOADED


def test_a_malformed_entry_is_skipped_by_every_reader(redis_url: str) -> None:
    async def scenario(redis):
        await redis.hset(keys.REGISTRY, mapping={"m": entry().to_bytes(), "bad": b"\x00not msgpack"})
        reader = RegistryReader(redis)
        with pytest.raises(ValueError):
            await reader.read("bad")  # the raw read says so ...
        return await reader.read_all(), await reader.get("bad"), await reader.read_many(["m", "bad", "x"])

    everything, bad, some = run(redis_url, scenario)
    assert set(everything) == {"m"} and bad is None and set(some) == {"m"}  # ... the others skip it


def test_the_view_reads_again_only_when_the_generation_moved(redis_url: str) -> None:
    async def scenario(redis):
        view = RegistryView(RegistryReader(redis))
        steps = [await view.refresh()]  # first read
        steps.append(await view.refresh())  # nothing changed: one GET
        await redis.hset(keys.REGISTRY, "m", entry().to_bytes())  # a write without a bump ...
        steps.append(await view.refresh())  # ... is not seen
        await redis.incr(keys.REGISTRY_GENERATION)
        steps.append(await view.refresh())
        view.invalidate()
        steps.append(await view.refresh())
        return steps, set(view.entries)

    steps, names = run(redis_url, scenario)
    assert steps == [True, False, False, True, True] and names == {"m"}


def test_compare_and_set_writes_only_over_the_entry_tried(redis_url: str) -> None:
    async def scenario(redis):
        reader = RegistryReader(redis)
        await redis.hset(keys.REGISTRY, "m", entry().to_bytes())
        _, tried = await reader.read("m")
        first = await compare_and_set(redis, tried, entry().load_failed("boom", 2))
        second = await compare_and_set(redis, tried, entry(state=UNAVAILABLE))  # stale: refused
        return first, second, await reader.get("m"), await reader.generation()

    first, second, now, generation = run(redis_url, scenario)
    assert (first, second, generation) == (True, False, 1)
    assert now.versions == [1] and now.failed == {2: "boom"} and now.ready


def test_the_version_rule_of_a_request() -> None:
    served = entry(versions=(1, 3), failed={2: "no model file"})
    assert select_version(served, None) == 3 and select_version(served, 1) == 1
    with pytest.raises(ModelNotReady, match="version 2 is not ready: no model file"):
        select_version(served, 2)
    with pytest.raises(ModelNotFound, match="Request for unknown model: 'm' version 7 is not found"):
        select_version(served, 7)
    with pytest.raises(ModelNotFound, match="unloaded"):
        select_version(ModelEntry("m", None, [1], UNAVAILABLE, UNLOADED), None)
    with pytest.raises(ModelNotReady, match="is not ready: broken config"):
        select_version(ModelEntry("m", None, [1], UNAVAILABLE, "broken config"), 1)
    assert parse_version("") is None and parse_version("12") == 12
    for bad in ("-1", "1.5", "x", "٣", "9" * 19):
        with pytest.raises(InvalidInput):
            parse_version(bad)
