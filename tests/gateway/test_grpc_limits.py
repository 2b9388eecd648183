"""How a unary gRPC call's message is read within the gateway's limits (gateway.grpc_limits).

The end-to-end cases (a 2 GiB declaration, a stalled message over a real connection) are in
tests/hardening/test_limits.py; these drive :func:`receive` with a message that arrives at a
chosen time, against a real :class:`ByteBudget`, with PROMPT_S shortened.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway import grpc_limits
from gateway.grpc_limits import GrpcLimits, receive
from gateway.limits import ByteBudget
from naiad.errors import InvalidInput, Overloaded, RequestTimeout

MESSAGE = b"x" * 100
LARGEST = 10_000


@pytest.fixture(autouse=True)
def short_prompt(monkeypatch):
    monkeypatch.setattr(grpc_limits, "PROMPT_S", 0.02)


async def _arriving(after_s: float, messages: tuple[bytes, ...] = (MESSAGE,)):
    await asyncio.sleep(after_s)
    for message in messages:
        yield message


async def _read(after_s: float, budget_bytes: int = 10 * LARGEST, read_timeout_s: float = 1.0, **kw):
    budget = ByteBudget(budget_bytes)
    limits = GrpcLimits(budget, max_message_bytes=LARGEST, read_timeout_s=read_timeout_s)
    with limits.budget.reservation() as held:
        seen: list[int] = []

        async def watch() -> None:  # what the call holds while its message is awaited
            while True:
                seen.append(held.held)
                await asyncio.sleep(0.005)

        watcher = asyncio.ensure_future(watch())
        try:
            raw = await receive(_arriving(after_s, **kw), limits, held)
            await asyncio.sleep(0.05)  # the call goes on past the prompt: nothing more is held
            return raw, held.held, max(seen), budget
        finally:
            watcher.cancel()


def test_a_prompt_message_holds_only_its_size():
    asyncio.run(_test_a_prompt_message_holds_only_its_size())


async def _test_a_prompt_message_holds_only_its_size():
    raw, held, most, _ = await _read(0.0)
    assert raw == MESSAGE and held == len(MESSAGE) and most == len(MESSAGE)


def test_a_late_message_holds_the_largest_size_while_it_is_read():
    asyncio.run(_test_a_late_message_holds_the_largest_size_while_it_is_read())


async def _test_a_late_message_holds_the_largest_size_while_it_is_read():
    raw, held, most, _ = await _read(0.1)
    assert raw == MESSAGE and most == LARGEST and held == len(MESSAGE)


def test_a_late_message_the_budget_cannot_hold_is_refused_at_the_prompt():
    asyncio.run(_test_a_late_message_the_budget_cannot_hold_is_refused_at_the_prompt())


async def _test_a_late_message_the_budget_cannot_hold_is_refused_at_the_prompt():
    started = asyncio.get_running_loop().time()
    with pytest.raises(Overloaded):
        await _read(5.0, budget_bytes=LARGEST - 1)
    assert asyncio.get_running_loop().time() - started < 1.0  # not after the message came


def test_a_message_past_the_read_timeout_ends_the_call():
    asyncio.run(_test_a_message_past_the_read_timeout_ends_the_call())


async def _test_a_message_past_the_read_timeout_ends_the_call():
    with pytest.raises(RequestTimeout, match="within 0.2 s"):
        await _read(5.0, read_timeout_s=0.2)


def test_a_call_without_a_message_is_invalid():
    asyncio.run(_test_a_call_without_a_message_is_invalid())


async def _test_a_call_without_a_message_is_invalid():
    with pytest.raises(InvalidInput, match="no request message"):
        await _read(0.0, messages=())


def test_the_calls_own_cancellation_stays_a_cancellation_and_gives_the_bytes_back():
    asyncio.run(_test_the_calls_own_cancellation_stays_a_cancellation_and_gives_the_bytes_back())


async def _test_the_calls_own_cancellation_stays_a_cancellation_and_gives_the_bytes_back():
    budget = ByteBudget(10 * LARGEST)
    limits = GrpcLimits(budget, max_message_bytes=LARGEST, read_timeout_s=0.2)

    async def call() -> bytes:
        with budget.reservation() as held:
            return await receive(_arriving(5.0), limits, held)

    task = asyncio.ensure_future(call())
    await asyncio.sleep(0.05)  # past the prompt: the largest size is held
    assert budget.used == LARGEST
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.3)  # the read timeout's timer must not fire into a later call
    assert budget.used == 0


class _Arrived:
    """The gRPC front's request iterator when the message came with the call's headers."""

    def __init__(self, message: bytes | None):
        self.message, self.iterated = message, False

    def ready(self) -> bytes | None:
        message, self.message = self.message, None
        return message

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        self.iterated = True
        await asyncio.sleep(0.05)
        return MESSAGE


def test_a_message_already_there_is_taken_without_waiting():
    async def body():
        budget = ByteBudget(10 * LARGEST)
        limits = GrpcLimits(budget, max_message_bytes=LARGEST)
        with budget.reservation() as held:
            arrived = _Arrived(b"y" * 50)
            assert await receive(arrived, limits, held) == b"y" * 50
            assert held.held == 50 and not arrived.iterated
        with budget.reservation() as held:  # nothing there yet: read as any call's message
            later = _Arrived(None)
            assert await receive(later, limits, held) == MESSAGE and later.iterated
            assert held.held == len(MESSAGE)

    asyncio.run(body())
