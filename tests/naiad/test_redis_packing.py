"""``naiad.redis_client``: commands packed by hiredis are the bytes redis-py's own packer
writes, what it refuses is refused the same way, and a real Redis answers them."""

from __future__ import annotations

import asyncio
import random

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from naiad.redis_client import LARGE_ARG_BYTES, CommandBatch, HeldConnection, connect

ARGS = [
    "", "é€", b"\x00\xff", 0, -3, 2**63, 2**64 - 1, -(2**63), 0.1, 1e300, -0.0, 1e-7, 100.0,
    float("inf"), float("nan"), 1733000000.123456, b"x" * 10_000, memoryview(b"view"), bytearray(b"ba"),
]  # fmt: skip


def test_packing_matches_redis_py_byte_for_byte():
    ours = connect("redis://127.0.0.1:1").connection_pool.make_connection()
    theirs = Connection()
    rng = random.Random(0)
    floats = [rng.uniform(-1e10, 1e10) for _ in range(500)] + [rng.random() * 10.0 ** rng.randint(-300, 300)
                                                              for _ in range(500)]  # fmt: skip
    for arg in [*ARGS, *floats]:
        assert b"".join(ours.pack_command("SET", "k", arg)) == b"".join(theirs.pack_command("SET", "k", arg))
    commands = [("CONFIG GET", "maxmemory"), (b"XADD", "s", "*", "f", 1.5), ("EVAL", "return 1", 0)]
    assert b"".join(ours.pack_commands(commands)) == b"".join(theirs.pack_commands(commands))


def test_a_large_value_is_not_copied_into_the_packed_command():
    ours = connect("redis://127.0.0.1:1").connection_pool.make_connection()
    data = bytes(LARGE_ARG_BYTES + 1)
    packed = ours.pack_command("XADD", "s", "*", "d", data)
    assert any(chunk is data for chunk in packed)  # sent as it is, after its length
    assert b"".join(packed) == b"".join(Connection().pack_command("XADD", "s", "*", "d", data))


@pytest.mark.parametrize("bad", [True, None, {"a": 1}, [1, 2]])
def test_what_redis_py_refuses_is_refused_alike(bad):
    ours = connect("redis://127.0.0.1:1").connection_pool.make_connection()
    with pytest.raises(DataError) as ours_error:
        ours.pack_command("SET", "k", bad)
    with pytest.raises(DataError) as theirs_error:
        Connection().pack_command("SET", "k", bad)
    assert str(ours_error.value) == str(theirs_error.value)


def test_a_real_redis_answers_packed_commands(redis_url):
    async def run():
        client = connect(redis_url)
        try:
            big = bytes(range(256)) * 400  # past the 6,000-byte cutoff of redis-py's packer
            await client.set("pack:big", big)
            async with client.pipeline(transaction=False) as pipe:
                pipe.set("pack:f", 0.1).incrbyfloat("pack:f", 1e-7).get("pack:big").hset("pack:h", "é", 2**63)
                _, total, got, _ = await pipe.execute()
            assert (float(total), got) == (pytest.approx(0.1 + 1e-7), big)
            assert await client.hget("pack:h", "é") == str(2**63).encode()
        finally:
            await client.aclose()

    asyncio.run(run())


def test_a_write_that_cannot_wait_skips_wait_for_and_one_that_can_keeps_it(redis_url, monkeypatch):
    """No ``asyncio.wait_for`` (a task and a timer in Python 3.11) around a write that goes to
    an empty transport buffer; a write behind unsent bytes goes through redis-py's path,
    whose drain the socket timeout bounds. Either way Redis gets the command."""
    import redis.asyncio.connection as redis_connection

    calls = []
    real_wait_for = asyncio.wait_for

    def counting_wait_for(awaitable, timeout):
        calls.append(timeout)
        return real_wait_for(awaitable, timeout)

    monkeypatch.setattr(redis_connection.asyncio, "wait_for", counting_wait_for)

    async def run():
        client = connect(redis_url)
        try:
            await client.set("send:a", 1)  # connects (redis-py's path once), then sends
            calls.clear()
            assert await client.incr("send:a") == 2
            assert calls == []
            connection = await client.connection_pool.get_connection()
            try:
                transport = connection._writer.transport
                monkeypatch.setattr(transport, "get_write_buffer_size", lambda: 1)  # bytes unsent
                await connection.send_command("INCR", "send:a")
                assert await connection.read_response() == 3
                assert calls == [connection.socket_timeout]
            finally:
                await client.connection_pool.release(connection)
        finally:
            await client.aclose()

    asyncio.run(run())


def test_more_commands_at_once_than_connections_wait_for_one(redis_url):
    """300 commands at once on one client (more than its MAX_CONNECTIONS): each waits for a
    free connection instead of failing with "Too many connections"."""
    from naiad.redis_client import MAX_CONNECTIONS

    async def run():
        client = connect(redis_url)
        try:
            await client.set("burst:k", b"v")
            got = await asyncio.gather(*(client.get("burst:k") for _ in range(3 * MAX_CONNECTIONS)))
            assert got == [b"v"] * (3 * MAX_CONNECTIONS)
        finally:
            await client.aclose()

    asyncio.run(run())


def test_a_command_batch_gets_every_reply_in_order_an_error_in_its_place(redis_url):
    """:func:`send_batch`: one write, raw replies in order (an XREADGROUP's entries as
    hiredis gives them), an error reply in its own place without failing the others, and
    the connection back in the pool, usable."""
    from redis.exceptions import ResponseError  # noqa: PLC0415

    from naiad.redis_client import CommandBatch, send_batch  # noqa: PLC0415

    async def run():
        client = connect(redis_url)
        try:
            await client.delete("batch:s", "batch:l", "batch:str")
            await client.xgroup_create("batch:s", "g", id="0", mkstream=True)
            entry = await client.xadd("batch:s", {"f": b"v"})
            await client.set("batch:str", "x")
            batch = CommandBatch()
            batch.rpush("batch:l", b"a", b"b")
            batch.lpush("batch:str", b"wrong type")  # an error reply
            batch.expire("batch:l", 60)
            batch.xreadgroup("g", "c", {"batch:s": ">"}, count=5, block=100)
            replies = await send_batch(client, batch)
            again = await send_batch(client, CommandBatch().lrange("batch:l", 0, -1))
            return entry, replies, again, client.connection_pool._in_use_connections
        finally:
            await client.aclose()

    entry, (pushed, wrong, expire, read), again, in_use = asyncio.run(run())
    assert pushed == 2 and isinstance(wrong, ResponseError) and expire == 1
    streams = list(read.items()) if isinstance(read, dict) else read  # RESP3 map or RESP2 list
    got = [(s, [(i, f) for i, f in entries]) for s, entries in streams]
    assert got == [(b"batch:s", [(entry, [b"f", b"v"])])]
    assert again == [[b"a", b"b"]] and not in_use


def test_a_cancelled_command_batch_leaves_no_reply_behind_for_the_next(redis_url):
    """A caller cancelled while its batch waits (a blocking read) drops that connection: the
    late reply can never be read as the answer to a later batch on the same client."""
    from naiad.redis_client import CommandBatch, send_batch  # noqa: PLC0415

    async def run():
        client = connect(redis_url, longest_block_s=5)
        try:
            await client.delete("batch:wait", "batch:k")
            waiting = asyncio.ensure_future(send_batch(client, CommandBatch().blpop(["batch:wait"], 5)))
            await asyncio.sleep(0.2)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            await client.rpush("batch:wait", b"late")  # nobody may take this as their reply
            return await send_batch(client, CommandBatch().set("batch:k", "1").get("batch:k"))
        finally:
            await client.aclose()

    assert asyncio.run(run()) == [b"OK", b"1"]  # raw replies


def test_a_held_connection_is_reused_reconnected_and_given_back(redis_url):
    """``HeldConnection``: batches go on one connection of the pool; one that Redis closed
    meanwhile (CLIENT KILL) is given back and another taken before the next batch, which
    succeeds; a second batch while one is in flight goes through the pool; a failed send
    gives the connection back to the pool."""

    async def run():
        client = connect(redis_url)
        held = HeldConnection(client)
        pool = client.connection_pool
        try:
            first = await held.send(CommandBatch().client_id().set("held:k", 1))
            assert first[1] in (True, b"OK") and len(pool._in_use_connections) == 1
            (again,) = await held.send(CommandBatch().client_id())
            assert again == first[0]  # the same connection
            await client.client_kill_filter(_id=again)
            for _ in range(500):  # until the loop has read the end of file (a loaded machine: later)
                if held._connection._reader.at_eof():
                    break
                await asyncio.sleep(0.01)
            (other, value) = await held.send(CommandBatch().client_id().get("held:k"))
            assert other != again and value == b"1"
            blocking = asyncio.ensure_future(held.send(CommandBatch().blpop(["held:none"], 0.2)))
            await asyncio.sleep(0.05)
            (meanwhile,) = await held.send(CommandBatch().client_id())  # through the pool
            assert meanwhile != other and len(pool._in_use_connections) == 1
            assert await blocking == [None]
            blocking = asyncio.ensure_future(held.send(CommandBatch().blpop(["held:none"], 5)))
            await asyncio.sleep(0.05)
            blocking.cancel()  # cut mid-batch: the connection is dropped and given back
            with pytest.raises(asyncio.CancelledError):
                await blocking
            assert not pool._in_use_connections
            (last,) = await held.send(CommandBatch().client_id())
            assert last not in (first[0], other)
        finally:
            await held.release()
            await client.aclose()

    asyncio.run(run())
