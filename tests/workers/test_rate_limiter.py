"""``workers/rate_limiter.py``: the pure policy (what a worker needs, with Triton's defaults,
flags and errors) and the shared limiter on a private redis-server, several
:class:`RateLimiter` clients standing for the workers of one machine."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf import text_format
from naiad_harness import run_scenario
from redis.asyncio import Redis
from tritonclient.grpc import model_config_pb2 as mc

from naiad import keys
from naiad.errors import ConfigError
from naiad.settings import Settings, parse_rate_limit_resource
from naiad.tasks import cancel_and_wait
from workers.rate_limiter import Need, RateLimiter, instance_group, needs

HOST = "test-host"


def config(groups: str) -> mc.ModelConfig:
    return text_format.Parse(f'name: "m" instance_group [ {groups} ]', mc.ModelConfig())


A = config('{ kind: KIND_CPU rate_limiter { resources [ { name: "R1" count: 4 }, '
           '{ name: "G" global: true count: 2 } ] priority: 2 } }')
B = config('{ kind: KIND_GPU gpus: [ 1 ] rate_limiter { resources [ { name: "R1" count: 6 } ] } }')
C = config('{ kind: KIND_CPU rate_limiter { resources [ { name: "R1" count: 5 }, '
           '{ name: "G" global: true count: 3 } ] } }')


def test_defaults_are_the_most_any_group_on_the_device_asks_for():
    wanted, priority = needs(A, "cpu", [B, C], [])
    # B's R1 is on GPU 1, not device 0 (where CPU workers are): it does not raise R1 there.
    assert wanted == [Need("0/R1", 4, 5), Need("global/G", 2, 3)] and priority == 2
    assert needs(B, "gpu:1", [A, C], [])[0] == [Need("1/R1", 6, 6)]


def test_flags_override_per_device_everywhere_or_globally():
    flags = ["R1:8", "R1:9:1", "G:7:3"]
    assert needs(A, "cpu", [C], flags)[0] == [Need("0/R1", 4, 8), Need("global/G", 2, 7)]
    assert needs(B, "gpu:1", [], flags)[0] == [Need("1/R1", 6, 9)]
    with pytest.raises(ConfigError, match='Resource count for "R1" is limited to 3 which will prevent'):
        needs(A, "cpu", [], ["R1:3"])


def test_a_resource_both_global_and_per_device_is_refused():
    other = config('{ kind: KIND_CPU rate_limiter { resources [ { name: "G" count: 1 } ] } }')
    with pytest.raises(ConfigError, match='Resource "G" is present as both global and device-specific'):
        needs(A, "cpu", [other], [])


def test_groups_without_a_rate_limiter_need_nothing_and_priority_0_is_1():
    assert needs(config("{ kind: KIND_CPU }"), "cpu", [A], []) == ([], 1)
    zero = config('{ kind: KIND_CPU rate_limiter { resources [ { name: "X" count: 1 } ] priority: 0 } }')
    assert needs(zero, "cpu", [], [])[1] == 1
    both = config('{ kind: KIND_GPU gpus: [ 0 ] count: 1 }, { kind: KIND_CPU rate_limiter { priority: 5 } }')
    assert instance_group(both, "cpu").kind == mc.ModelInstanceGroup.KIND_CPU
    assert instance_group(both, "gpu:0").kind == mc.ModelInstanceGroup.KIND_GPU


@pytest.mark.parametrize("bad", ["R", "R:x", ":1", "R:1:2:3", "R:-1", "R:1:gpu0"])
def test_bad_resource_flags_are_refused(bad):
    with pytest.raises(ValueError, match="expected NAME:COUNT"):
        parse_rate_limit_resource(bad)
    with pytest.raises(ValueError):
        Settings(rate_limit_resource=[bad])


def limiter(redis: Redis, worker: str, wanted: list[Need], priority: int = 1, lease_ms: int = 5000):
    return RateLimiter(redis, HOST, worker, wanted, priority, lease_ms=lease_ms)


async def waiting(redis: Redis, count: int) -> None:
    """Until ``count`` workers wait in line (the event itself, not a delay)."""
    while await redis.zcard(keys.rate_limit_waiting(HOST)) != count:
        await asyncio.sleep(0.01)


ONE = [Need("0/R", 1, 1)]


def test_a_copy_is_held_by_one_worker_at_a_time(redis_url):
    async def scenario(redis: Redis) -> None:
        a, b = limiter(redis, "a", ONE), limiter(redis, "b", ONE)
        await a.acquire()
        taking = asyncio.create_task(b.acquire())
        await waiting(redis, 1)
        assert not taking.done() and await redis.hget(keys.rate_limit_used(HOST), "0/R") == b"1"
        await a.release()
        await asyncio.wait_for(taking, 10)
        assert await redis.hgetall(keys.rate_limit_holders(HOST)) == {b"b": b'[["0\\/R",1,1]]'}
        await b.release()
        assert await redis.hget(keys.rate_limit_used(HOST), "0/R") == b"0"

    run_scenario(redis_url, scenario)


def test_lowest_scaled_priority_goes_first_and_the_head_is_never_overtaken(redis_url):
    async def scenario(redis: Redis) -> None:
        two, one = [Need("0/R", 2, 2)], [Need("0/R", 1, 2)]
        holder, small = limiter(redis, "holder", one), limiter(redis, "small", one)
        slow, fast = limiter(redis, "slow", two, priority=2), limiter(redis, "fast", two)
        slow.executions = fast.executions = 1  # scaled: slow 2, fast 1
        small.executions = 5  # scaled 5: last in line, though 1 copy is free for it
        await holder.acquire()
        order: list[str] = []

        async def run(worker: RateLimiter) -> None:
            await worker.acquire()
            order.append(worker.worker_id)

        tasks = [asyncio.create_task(run(slow))]
        await waiting(redis, 1)
        tasks += [asyncio.create_task(run(fast))]
        await waiting(redis, 2)
        tasks += [asyncio.create_task(run(small))]
        await waiting(redis, 3)
        assert order == []  # small fits in the free copy but is behind the head
        await holder.release()
        while not order:
            await asyncio.sleep(0.01)
        assert order == ["fast"]
        await fast.release()
        while len(order) < 2:
            await asyncio.sleep(0.01)
        await slow.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert order == ["fast", "slow", "small"]
        await small.release()

    run_scenario(redis_url, scenario)


def test_copies_of_a_holder_that_stops_renewing_come_back_after_its_lease(redis_url):
    async def scenario(redis: Redis) -> None:
        dead = limiter(redis, "dead", ONE, lease_ms=300)
        await dead.acquire()  # never released, never renewed: a killed worker
        survivor = limiter(redis, "survivor", ONE)
        await asyncio.wait_for(survivor.acquire(), 10)
        assert await redis.hkeys(keys.rate_limit_holders(HOST)) == [b"survivor"]
        await survivor.release()

    run_scenario(redis_url, scenario)


def test_devices_and_resources_do_not_contend(redis_url):
    async def scenario(redis: Redis) -> None:
        gpu0, gpu1 = limiter(redis, "g0", [Need("0/R", 1, 1)]), limiter(redis, "g1", [Need("1/R", 1, 1)])
        other = limiter(redis, "o", [Need("0/S", 1, 1)])
        for worker in (gpu0, gpu1, other):
            await asyncio.wait_for(worker.acquire(), 5)
        for worker in (gpu0, gpu1, other):
            await worker.release()

    run_scenario(redis_url, scenario)


def test_a_waiter_that_is_cancelled_leaves_the_line(redis_url):
    async def scenario(redis: Redis) -> None:
        a, b, c = limiter(redis, "a", ONE), limiter(redis, "b", ONE), limiter(redis, "c", ONE)
        await a.acquire()

        async def use(worker: RateLimiter) -> None:
            async with worker.slot():
                pass

        gone = asyncio.create_task(use(b))
        await waiting(redis, 1)
        await cancel_and_wait(gone)  # a plain cancel may be lost (naiad.tasks)
        assert gone.cancelled()
        await waiting(redis, 0)
        next_in_line = asyncio.create_task(use(c))
        await waiting(redis, 1)
        await a.release()
        await asyncio.wait_for(next_in_line, 10)
        assert await redis.hlen(keys.rate_limit_holders(HOST)) == 0

    run_scenario(redis_url, scenario)


def test_a_holder_keeps_its_copies_past_its_lease_while_it_renews(redis_url):
    async def scenario(redis: Redis) -> None:
        holder = limiter(redis, "holder", ONE, lease_ms=300)
        other = limiter(redis, "other", ONE, lease_ms=300)
        released = asyncio.Event()

        async def hold() -> None:
            async with holder.slot():
                await waiting(redis, 1)
                for _ in range(6):  # six leases long, with the other in line all along
                    await asyncio.sleep(0.3)
                    assert await redis.hkeys(keys.rate_limit_holders(HOST)) == [b"holder"]
                released.set()

        holding = asyncio.create_task(hold())
        await asyncio.sleep(0)
        while not await redis.hexists(keys.rate_limit_holders(HOST), "holder"):
            await asyncio.sleep(0.01)
        await asyncio.wait_for(other.acquire(), 10)
        assert released.is_set()
        await holding
        await other.release()

    run_scenario(redis_url, scenario)
