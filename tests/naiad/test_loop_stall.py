"""naiad.loop_stall and the stall-tolerant Redis reads (naiad.redis_client), on a real
redis-server: a reply read across a stall of the loop longer than the socket timeout is
read, not dropped; a peer that never answers still times out; no running loop inside a
stall; a stand-in acts only during a stall."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import redis.exceptions

from naiad import loop_stall, redis_client
from naiad.eventloop import loop_factory


def run(main, use_uvloop: bool):
    with asyncio.Runner(loop_factory=loop_factory() if use_uvloop else None) as runner:
        return runner.run(main)


@pytest.fixture
def short_timeouts(monkeypatch):
    """Clients made now get a 0.3 s socket timeout (COMMAND_TIMEOUT_S + their longest block)."""
    monkeypatch.setattr(redis_client, "COMMAND_TIMEOUT_S", 0.3)


async def claim_across_a_stall(url: str, tolerate: bool, stall_s: float) -> object:
    """A blocking read of 0.2 s sent (as a worker's claim), then the loop stalled (as a
    model's call stalls it) past the client's socket timeout (0.5 s): its reply comes during
    the stall and waits in the socket."""
    client = redis_client.connect(url, longest_block_s=0.2, tolerate_stalls=tolerate)
    try:
        await client.ping()  # connected
        task = asyncio.ensure_future(client.blpop(["nothing"], timeout=0.2))
        await asyncio.sleep(0.01)  # sent
        with loop_stall.stalled():
            time.sleep(stall_s)
        return await task
    finally:
        await client.aclose()


@pytest.mark.parametrize("use_uvloop", [True, False])
def test_a_reply_waiting_across_a_stall_is_read_not_timed_out(redis_url, short_timeouts, use_uvloop):
    assert run(claim_across_a_stall(redis_url, True, 1.0), use_uvloop) is None


@pytest.mark.parametrize("use_uvloop", [True, False])
def test_a_plain_client_takes_the_stall_for_a_dead_redis(redis_url, short_timeouts, use_uvloop):
    """What the tolerant reads are for: the same stall fails a plain client's read."""
    with pytest.raises(redis.exceptions.TimeoutError):
        run(claim_across_a_stall(redis_url, False, 1.0), use_uvloop)


def test_a_peer_that_never_answers_still_times_out(short_timeouts):
    """Stalls aside, the socket timeout holds: a server that accepts and never replies."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        async def main() -> float:
            client = redis_client.connect(f"redis://127.0.0.1:{port}", tolerate_stalls=True)
            started = time.monotonic()
            try:
                with pytest.raises(redis.exceptions.TimeoutError):
                    await client.ping()
                return time.monotonic() - started
            finally:
                await client.aclose()

        assert 0.25 < run(main(), True) < 2.0


def test_no_running_loop_inside_a_stall_and_the_clock_counts_it():
    async def main() -> tuple:
        loop, before = asyncio.get_running_loop(), loop_stall.clock()
        with loop_stall.stalled():
            with pytest.raises(RuntimeError):
                asyncio.get_running_loop()
            own = asyncio.run(asyncio.sleep(0, "own loop"))  # as a model may
            time.sleep(0.05)
        return asyncio.get_running_loop() is loop, own, loop_stall.clock() - before

    same_loop, own, stalled = run(main(), True)
    assert same_loop and own == "own loop"
    assert 0.05 <= stalled < 1.0


def test_a_stand_in_acts_only_while_a_stall_lasts():
    acted: list[float] = []
    assert loop_stall.while_stalled(0.0, lambda: acted.append(1)) is None  # no stall

    def stand_in() -> None:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and not acted:
            loop_stall.while_stalled(0.1, lambda: acted.append(time.monotonic()))
            time.sleep(0.01)

    async def main() -> float:
        thread = threading.Thread(target=stand_in)
        with loop_stall.stalled():
            started = time.monotonic()
            thread.start()
            time.sleep(0.4)
        thread.join()
        return started

    started = run(main(), True)
    assert len(acted) == 1 and acted[0] - started >= 0.1  # once the stall lasted 0.1 s
    assert loop_stall.while_stalled(0.0, lambda: acted.append(2)) is None  # none after its end
    assert len(acted) == 1
