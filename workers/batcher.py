"""The dynamic batcher of one worker: its policy, and the queue of requests it holds.

Triton docs/user_guide/batcher.md: with ``dynamic_batching`` set (and ``max_batch_size`` >
0) requests are combined up to ``max_batch_size`` rows, preferring the largest
``preferred_batch_size`` that can be formed and waiting up to
``max_queue_delay_microseconds`` (counted from the oldest request's enqueue) for one
(:func:`workers.batching.next_batch`). Without ``dynamic_batching`` every request runs alone.

A worker claims requests from its model's streams into a :class:`Batcher` (a window of at
most :attr:`BatchPolicy.window` entries), which keeps them in Triton's queue order: priority
level first (:mod:`naiad.queue_policy`), then within a level the requests whose queue
timeout has not passed before those that passed it under a DELAY policy, then arrival. Those
whose timeout passed under a REJECT policy leave through :meth:`Batcher.expired`. A request
reclaimed from a worker that died runs in a batch of its own, before the others
(:func:`workers.reclaim.runs_alone`). Nothing here does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from naiad import queue_policy
from naiad.codec import QueuedRequest, entry_order
from workers import batching, reclaim


@dataclass(frozen=True)
class BatchPolicy:
    """``enabled``: dynamic batching on; ``max_batch_size``: rows per batch at most;
    ``preferred``: the preferred batch sizes; ``max_queue_delay_s``: seconds;
    ``contiguous``: never pass over an incompatible request (``preserve_ordering``, or
    priority levels: a later request must not overtake an earlier one of a higher level)."""

    enabled: bool
    max_batch_size: int
    preferred: tuple[int, ...] = ()
    max_queue_delay_s: float = 0.0
    contiguous: bool = False

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> BatchPolicy:
        enabled = config.HasField("dynamic_batching") and config.max_batch_size > 0
        settings = config.dynamic_batching
        top = config.max_batch_size
        preferred = tuple(sorted({n for n in settings.preferred_batch_size if 0 < n <= top}))
        contiguous = settings.preserve_ordering or queue_policy.priority_levels(config) > 0
        return cls(enabled, config.max_batch_size, preferred,
                   settings.max_queue_delay_microseconds / 1e6, contiguous)  # fmt: skip

    @property
    def window(self) -> int:
        """Entries a worker holds claimed at most: two full batches when batching (one to
        run, one to choose the next from), else one."""
        return 2 * self.max_batch_size if self.enabled else 1


@dataclass(frozen=True)
class Held:
    """One claimed request with what its queue policy makes of it: ``deadline`` (Unix
    seconds its queue timeout ends, ``inf`` for none) and ``reject`` (REJECT, not DELAY)."""

    queued: QueuedRequest
    deadline: float
    reject: bool

    def order(self, now: float) -> tuple[int, bool, tuple[int, int], float]:
        delayed = not self.reject and now > self.deadline
        return self.queued.level, delayed, entry_order(self.queued.entry_id), self.queued.enqueued_at


class Batcher:
    """The requests one worker has claimed and not yet run (see the module doc).

    ``model`` and ``config``: the model served (its queue policies); ``policy``: its
    :class:`BatchPolicy`. Times are Unix seconds (``enqueued_at`` is the gateway's clock).
    """

    def __init__(self, model: str, config: mc.ModelConfig, policy: BatchPolicy):
        self.model, self.config, self.policy = model, config, policy
        self._held: list[Held] = []

    def __len__(self) -> int:
        return len(self._held)

    @property
    def room(self) -> int:
        """Entries to claim to fill the window."""
        return max(self.policy.window - len(self._held), 0)

    def add(self, requests: Iterable[QueuedRequest]) -> None:
        for queued in requests:
            parameters = queued.request.parameters
            timeout_s, reject = queue_policy.queue_timeout(self.config, queued.level, parameters)
            deadline = queued.enqueued_at + timeout_s if timeout_s else math.inf
            self._held.append(Held(queued, deadline, reject))

    def expired(self, now: float) -> list[QueuedRequest]:
        """Remove and return the requests whose queue timeout passed under REJECT."""
        gone = [h for h in self._held if h.reject and now > h.deadline]
        if not gone:
            return []
        self._held = [h for h in self._held if not (h.reject and now > h.deadline)]
        return [h.queued for h in gone]

    def take(self, now: float, flush: bool = False) -> tuple[list[QueuedRequest], float]:
        """The next batch (removed from the window), or ``([], seconds)`` to wait at most that
        long for more (the batching delay, or a queue timeout that ends sooner). ``flush``:
        no waiting (draining). A reclaimed request comes first, alone, at once."""
        if len(self._held) > 1:
            self._held.sort(key=lambda h: h.order(now))
        alone = next((h for h in self._held if reclaim.runs_alone(h.queued.deliveries)), None)
        if alone is not None:
            self._held.remove(alone)
            return [alone.queued], 0.0
        requests = [h.queued.request for h in self._held]
        ages = [max(0.0, now - h.queued.enqueued_at) for h in self._held]  # clocks may differ
        delay_s = 0.0 if flush else self.policy.max_queue_delay_s
        max_rows = self.policy.max_batch_size if self.policy.enabled else 0
        indices, wait_s = batching.next_batch(
            requests, ages, max_rows, self.policy.preferred, delay_s, self.policy.contiguous
        )
        if not indices:
            deadlines = [h.deadline - now for h in self._held if h.deadline > now]
            return [], min([wait_s, *deadlines]) if self._held else wait_s
        chosen = set(indices)
        batch = [self._held[i].queued for i in indices]
        self._held = [h for i, h in enumerate(self._held) if i not in chosen]
        return batch, 0.0

    def requests(self) -> list[QueuedRequest]:
        """The requests held (claimed, not yet taken), in no particular order."""
        return [h.queued for h in self._held]

    def remove(self, requests: Iterable[QueuedRequest]) -> None:
        """Forget ``requests`` (handed back, or no longer this worker's)."""
        gone = {id(q) for q in requests}
        self._held = [h for h in self._held if id(h.queued) not in gone]
