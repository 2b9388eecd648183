"""Bounds on what clients can make the gateway hold, shared by the HTTP and gRPC adapters.

:class:`ByteBudget` is one bound on the request bytes buffered across every request in
flight, over both transports (``--max-buffered-bytes``): HTTP bodies count as they are read,
chunk by chunk (a slow upload holds only what it sent), gRPC messages while grpc core reads
them (the largest message, ``--grpc-max-message-size``, for each message being read, then
its real size once it arrived). A request that would take the budget over its bound is
refused at once with :class:`naiad.errors.Overloaded` (503 + ``Retry-After`` /
UNAVAILABLE), before more of it is read. No transport import here.
"""

from __future__ import annotations

from naiad.errors import Overloaded


class ByteBudget:
    """Bytes held by requests now, at most ``max_bytes`` in all."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.used = 0

    def reservation(self) -> Reservation:
        """A new, empty reservation against this budget (use it as a context manager)."""
        return Reservation(self)


class Reservation:
    """The bytes one request holds against a :class:`ByteBudget`; :meth:`release` (or the
    end of a ``with`` block) gives them all back."""

    def __init__(self, budget: ByteBudget):
        self._budget = budget
        self.held = 0

    def add(self, n: int) -> None:
        """Hold ``n`` more bytes; raises :class:`Overloaded` (nothing held) when the budget
        cannot take them."""
        budget = self._budget
        if budget.used + n > budget.max_bytes:
            raise Overloaded(
                f"the gateway buffers {budget.used} request bytes of at most {budget.max_bytes} "
                f"(--max-buffered-bytes); retry later"
            )
        budget.used += n
        self.held += n

    def resize(self, n: int) -> None:
        """Hold exactly ``n`` bytes: shrinking always succeeds, growing may raise
        :class:`Overloaded` as :meth:`add` does."""
        if n >= self.held:
            self.add(n - self.held)
        else:
            self._budget.used -= self.held - n
            self.held = n

    def release(self) -> None:
        self._budget.used -= self.held
        self.held = 0

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
