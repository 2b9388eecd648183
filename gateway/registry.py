"""The model registry: which models exist, their configs, versions and state, in Redis.

Indexing reads the model repository (local folder or S3) and writes one entry per model into
the :data:`naiad.keys.REGISTRY` hash, bumping a generation counter. Every gateway keeps a
read-through copy that it reloads only when the generation changes, so the hot path does not
touch Redis for configs and any gateway sees what another one indexed.
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

from naiad import keys
from naiad.errors import ModelNotFound
from repository_store import ModelEntry, RepositoryStore, index_repository

logger = logging.getLogger(__name__)

GENERATION = f"{keys.REGISTRY}:generation"


class ModelRegistry:
    """Models known to the server. ``get`` raises :class:`ModelNotFound` for unknown names."""

    def __init__(self, redis: aioredis.Redis, store: RepositoryStore):
        self.redis = redis
        self.store = store
        self._entries: dict[str, ModelEntry] = {}
        self._generation: int | None = None

    async def index(self) -> dict[str, ModelEntry]:
        """Re-read the whole repository into Redis. Raises RepositoryError if unreachable."""
        entries = await asyncio.to_thread(index_repository, self.store)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.REGISTRY)
            if entries:
                pipe.hset(keys.REGISTRY, mapping={n: e.to_bytes() for n, e in entries.items()})
            pipe.incr(GENERATION)
            *_, generation = await pipe.execute()
        self._entries, self._generation = entries, generation
        for entry in entries.values():
            if entry.state != "READY":
                logger.warning("model '%s' is unavailable: %s", entry.name, entry.reason)
        logger.info("indexed %d models from %s", len(entries), self.store.uri)
        return entries

    async def sync(self) -> None:
        """Reload the local copy from Redis if another gateway re-indexed since."""
        generation = int(await self.redis.get(GENERATION) or 0)
        if generation == self._generation:
            return
        raw = await self.redis.hgetall(keys.REGISTRY)
        self._entries = {name.decode(): ModelEntry.from_bytes(value) for name, value in raw.items()}
        self._generation = generation

    async def get(self, name: str) -> ModelEntry:
        entry = self._entries.get(name)
        if entry is None:
            await self.sync()
            entry = self._entries.get(name)
        if entry is None:
            raise ModelNotFound(f"unknown model: '{name}'")
        return entry

    def entries(self) -> list[ModelEntry]:
        """The local copy's entries, sorted by name."""
        return [self._entries[name] for name in sorted(self._entries)]
