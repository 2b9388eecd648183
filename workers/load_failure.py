"""A model whose load fails in a worker becomes UNAVAILABLE in the registry, with the reason.

Triton marks a model whose load fails UNAVAILABLE, the load error its repository index
``reason``, until it is loaded again (model_management.md: an explicit load, or the
repository changing under poll mode). Here the registry entry the gateways serve from is
only an index (config and files present); whether the backend accepts the files shows in the
worker. When that fails for a reason in the model (:func:`is_model_fault`), the worker
replaces the entry it tried with :meth:`ModelEntry.load_failed` and bumps the registry
generation (:func:`mark_unavailable`), so every gateway refuses the model with the reason on
its next sync (``ready`` false) and the scaler gives it no minimum of workers: no crash loop.

The write is a compare-and-set against the exact entry bytes the worker loaded from, in one
Lua script (:func:`naiad.registry.compare_and_set`): a load or re-index that replaced the
entry meanwhile (a fixed file, a new config) is never overwritten by an older failure.
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis

from naiad import registry, telemetry
from naiad.errors import InvalidInput, ModelNotReady, NaiadError, Unsupported
from naiad.registry import ModelEntry

logger = logging.getLogger(__name__)

#: Load errors that lie in the model and repeat on every try until it changes: the backend
#: rejects its files or config (ModelNotReady, also a Python model's ``initialize`` raising
#: and a failing ``model_warmup`` sample), its backend is missing from this deployment
#: (Unsupported), its config is invalid (InvalidInput, ConfigError). A 503 (RepositoryError:
#: the repository unreachable during the pull; Unavailable) is transient and is not one.
MODEL_FAULTS: tuple[type[NaiadError], ...] = (ModelNotReady, Unsupported, InvalidInput)


def is_model_fault(error: NaiadError) -> bool:
    """True when a load that raised ``error`` failed because of the model itself."""
    return isinstance(error, MODEL_FAULTS)


async def mark_unavailable(redis: Redis, tried: bytes, reason: str, version: int | None = None) -> bool:
    """Replace registry entry ``tried`` (its encoded bytes, as read) by the same entry with
    ``version`` failed for ``reason`` (:meth:`ModelEntry.load_failed`: the other versions
    keep serving; none left, or no version given: UNAVAILABLE), bump the generation and count
    one load failure; False, writing nothing, when the registry holds anything else for that
    model by now. Raises ``ValueError`` for malformed ``tried``, ``RedisError`` when Redis fails."""
    failed = ModelEntry.from_bytes(tried).load_failed(reason, version)
    written = await registry.compare_and_set(redis, tried, failed)
    if written:
        async with redis.pipeline(transaction=False) as pipe:
            telemetry.add_load_failure(pipe, failed.name)
            await pipe.execute()
    return bool(written)
