"""The dynamic batcher's policy, read from a model's ``dynamic_batching`` config.

Triton docs/user_guide/batcher.md: with ``dynamic_batching`` set (and ``max_batch_size`` >
0) requests are combined up to ``max_batch_size`` rows; the batcher stops waiting as soon as
it holds the largest ``preferred_batch_size`` (or ``max_batch_size`` without one), or when
the oldest request has waited ``max_queue_delay_microseconds``. Without
``dynamic_batching`` every request runs alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from naiad.codec import QueuedRequest
from workers import batching


@dataclass(frozen=True)
class BatchPolicy:
    """``enabled``: dynamic batching on; ``max_batch_size``: rows per batch at most;
    ``target_rows``: rows at which to stop waiting; ``max_queue_delay_s``: seconds."""

    enabled: bool
    max_batch_size: int
    target_rows: int
    max_queue_delay_s: float

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> BatchPolicy:
        enabled = config.HasField("dynamic_batching") and config.max_batch_size > 0
        settings = config.dynamic_batching
        preferred = [size for size in settings.preferred_batch_size if size > 0]
        target = min(max(preferred, default=config.max_batch_size), config.max_batch_size)
        return cls(enabled, config.max_batch_size, max(target, 1),
                   settings.max_queue_delay_microseconds / 1e6)

    @property
    def read_count(self) -> int:
        """Stream entries to claim in one read."""
        return max(self.max_batch_size, 1) if self.enabled else 1

    @property
    def plan_rows(self) -> int:
        """Row cap for :func:`workers.batching.plan_batches` (0: every request alone)."""
        return self.max_batch_size if self.enabled else 0

    def rows_wanted(self, requests: Sequence[QueuedRequest]) -> int:
        """Entries still worth waiting for (0 when the batch is full enough)."""
        have = sum(batching.rows(queued.request) for queued in requests)
        return max(self.target_rows - have, 0)
