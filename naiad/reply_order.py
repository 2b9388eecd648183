"""Answers released in the order their requests entered the queue (``preserve_ordering``).

Triton's ``dynamic_batching { preserve_ordering: true }`` returns responses "in the same
order as the order of requests sent to the scheduler" (model_config.proto). With several
workers per model, batches finish in any order, so the client side of the queue holds each
answer until every request of the same stream that Redis accepted earlier *from this client*
(a lower entry id) has its answer, failed or gone. Ordering is therefore per gateway (per
:class:`naiad.queue_client.QueueDispatcher`): requests sent through different gateways have
no order a client could observe. Nothing here does I/O.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from naiad.codec import entry_order


@dataclass(eq=False)
class Slot:
    """One request's place: its entry id's order once known, and whether it is done."""

    order: tuple[int, int] | None = None
    placed: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class ReplyOrder:
    """The requests in flight per stream, in the order to release their answers.

    A caller :meth:`open`\\ s a slot before its ``XADD``, :meth:`place`\\ s it with the entry
    id, awaits :meth:`turn` once its answer is in, and :meth:`close`\\ s it in every case.
    """

    def __init__(self) -> None:
        self._slots: dict[str, list[Slot]] = {}

    def open(self, stream: str) -> Slot:
        slot = Slot()
        self._slots.setdefault(stream, []).append(slot)
        return slot

    @staticmethod
    def place(slot: Slot, entry_id: bytes) -> None:
        slot.order = entry_order(entry_id)
        slot.placed.set()

    async def turn(self, stream: str, slot: Slot) -> None:
        """Return once every request of ``stream`` that entered the queue before ``slot``'s
        is done. A request whose XADD has not returned yet may still get an earlier id: it
        is waited for until it knows (one opened later cannot: its XADD came after ours)."""
        for other in list(self._slots.get(stream, ())):
            if other is slot:
                continue
            await other.placed.wait()
            if other.order is not None and slot.order is not None and other.order < slot.order:
                await other.done.wait()

    def close(self, stream: str, slot: Slot) -> None:
        """``slot``'s request is answered, failed or gone: later ones need not wait for it."""
        slot.placed.set()
        slot.done.set()
        slots = self._slots.get(stream, [])
        if slot in slots:
            slots.remove(slot)
        if not slots:
            self._slots.pop(stream, None)
