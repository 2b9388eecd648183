"""The model registry: which models exist, their configs, versions and state, in Redis.

Indexing reads the model repository (local folder or S3) and writes one entry per model into
the :data:`naiad.keys.REGISTRY` hash, bumping a generation counter. Every gateway keeps a
read-through copy that it reloads only when the generation changes, so the hot path does not
touch Redis for configs and any gateway sees what another one indexed: the generation is
checked on a miss and at most once every :data:`SYNC_INTERVAL_S` on a hit, so a model another
gateway unloaded stops being served here within that time.

Model control (Triton's ``--model-control-mode``): :meth:`ModelRegistry.start` indexes the
whole repository (``none``, ``poll``) or only the models to load (``explicit``; the others
get an ``UNAVAILABLE`` "unloaded" entry); :meth:`ModelRegistry.poll` re-indexes and writes
only the entries that changed; :meth:`ModelRegistry.load` and :meth:`ModelRegistry.unload`
change one entry. An explicit :meth:`ModelRegistry.load` first loads the model in a child
process (its ``load_check``, :class:`gateway.load_probe.LoadProbe`), as Triton's load_model
loads before it answers: a model whose files the backend refuses is published UNAVAILABLE
with the load error rather than READY.

A worker whose load of a READY entry fails in the model (backend error, failing warmup)
replaces that entry with an UNAVAILABLE one carrying the load error
(:mod:`workers.load_failure`). It stays so until the model is indexed again: :meth:`load`,
or in poll mode a change of its files (a poll whose fingerprints did not change re-indexes
nothing, so it never flips the model back by itself), or a full :meth:`index`.

Ensembles: Redis holds each model's own entry; the local copy is that with
:func:`repository_store.resolve_ensembles` applied, so an ensemble is READY only while its
composing models are (every gateway derives the same from the same entries). In explicit
mode, loading an ensemble also loads its composing models that are not loaded, as Triton does.

Polling costs what changed, not the repository's size: each poll lists the repository once
(:meth:`RepositoryStore.fingerprints`: one paged S3 listing with ETags, or one local walk
with ``stat``) and re-indexes (reads configs, fetches ONNX files to auto-complete) only the
models whose fingerprint differs from the previous poll's, or that Redis does not hold.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from naiad import keys, rollout, telemetry
from naiad.errors import ModelNotFound, RepositoryError
from naiad.registry import UNAVAILABLE, UNLOADED, ModelEntry, RegistryReader, publish
from repository_store import (
    ModelConfig,
    RepositoryStore,
    index_model,
    index_models,
    index_repository,
    keep_last_good,
    resolve_ensembles,
)
from repository_store.ensemble import composing_models, is_ensemble

logger = logging.getLogger(__name__)

#: Longest time a gateway serves from its copy without checking the generation.
SYNC_INTERVAL_S = 1.0
#: ``--load-model`` value that loads every model.
ALL_MODELS = "*"


class ModelRegistry:
    """Models known to the server. ``get`` raises :class:`ModelNotFound` for unknown names.
    ``load_check``: what :meth:`load` runs on each entry it would publish READY (None when
    it loaded, else the load error); None: no check."""

    def __init__(
        self, redis: aioredis.Redis, store: RepositoryStore,
        load_check: Callable[[ModelEntry], Awaitable[str | None]] | None = None,
    ):  # fmt: skip
        self.redis = redis
        self.reader = RegistryReader(redis)
        self.store = store
        self.load_check = load_check
        self._entries: dict[str, ModelEntry] = {}
        self._rollbacks: dict[str, dict[int, str]] = {}
        self._generation: int | None = None
        self._synced_at = float("-inf")
        self._fingerprints: dict[str, str] = {}
        self._start_args: tuple[str, list[str]] = ("none", [])  # how to index again
        self._rebuilding = asyncio.Lock()
        #: Models re-indexed by the last :meth:`poll` (what a poll cost; tests and benches).
        self.last_poll_indexed: list[str] = []

    async def start(self, mode: str, load: list[str]) -> None:
        """The start-up indexing of model control ``mode`` (``load``: explicit mode's models)."""
        self._start_args = (mode, list(load))
        if mode == "explicit":
            await self.index_explicit(load)
            return
        if mode == "poll":  # the baseline, taken before indexing: a change meanwhile shows next poll
            self._fingerprints = await asyncio.to_thread(self.store.fingerprints)
        await self.index()

    async def index(self) -> dict[str, ModelEntry]:
        """Re-read the whole repository into Redis; an entry that would replace a different,
        serving one is load-checked first, and a failure keeps that one (:meth:`_settle`: a
        gateway starting during a bad upload takes nothing down). Raises RepositoryError if
        unreachable."""
        fresh = await asyncio.to_thread(index_repository, self.store)
        current = await self._read_all()  # a malformed entry: skipped, so indexed afresh
        entries, failures = await self._settle(fresh, current, serving_only=True)
        async with self.redis.pipeline(transaction=True) as pipe:
            publish(pipe, entries, replace_all=True)
            *_, generation = await pipe.execute()
        await self._count_failures(failures)
        self._entries, self._generation = resolve_ensembles(entries), generation
        self._rollbacks = await self._read_rollbacks()
        for entry in self._entries.values():
            if entry.state != "READY":
                logger.warning("model '%s' is unavailable: %s", entry.name, entry.reason)
        logger.info("indexed %d models from %s", len(entries), self.store.uri)
        return entries

    async def index_explicit(self, load: list[str]) -> None:
        """Explicit mode's start: index the ``load`` models (``*``: all); every other model
        of the repository gets an UNAVAILABLE "unloaded" entry unless Redis already holds one
        (a model another gateway loaded stays loaded)."""
        names = await asyncio.to_thread(self.store.list_models)
        wanted = set(names) if ALL_MODELS in load else set(load)
        loaded = {name: await asyncio.to_thread(index_model, self.store, name) for name in sorted(wanted)}
        loaded = await self._with_composing(loaded)
        loaded, failures = await self._settle(loaded, await self._read(sorted(loaded)), serving_only=True)
        placeholders = {name: ModelEntry(name, None, reason=UNLOADED) for name in names if name not in loaded}
        async with self.redis.pipeline(transaction=True) as pipe:
            publish(pipe, loaded, unless_present=placeholders)
            await pipe.execute()
        await self._count_failures(failures)
        await self.sync()
        logger.info("explicit model control: loaded %s", ", ".join(sorted(loaded)) or "no model")

    async def poll(self) -> bool:
        """Re-index the models whose files changed since the last poll (fingerprints),
        load-check the changed ones, and write only the entries that differ (new, changed and
        removed models) with one generation bump; nothing at all when nothing changed. A
        change that fails leaves what was serving serving (:func:`keep_last_good`). True if
        something was written. Raises RepositoryError if the repository is unreachable (the
        next poll retries)."""
        prints = await asyncio.to_thread(self.store.fingerprints)
        known = await self.reader.names()
        stale = sorted(n for n, p in prints.items() if self._fingerprints.get(n) != p or n not in known)
        self.last_poll_indexed = stale
        fresh = await asyncio.to_thread(index_models, self.store, stale) if stale else {}
        current = await self._read(stale)
        settled, failures = await self._settle(fresh, current)
        changed = {name: entry for name, entry in settled.items() if entry != current.get(name)}
        failures = {name: why for name, why in failures.items() if name in changed}  # counted once
        removed = sorted(known - set(prints))
        if not changed and not removed:
            self._fingerprints = prints
            return False
        await self._write(changed, removed, failures)
        self._fingerprints = prints  # only once written: a failed write is retried next poll
        for name, entry in sorted(changed.items()):
            verb = "changed" if name in current else "added"
            log = logger.warning if name in failures else logger.info
            log("model '%s' %s: %s %s", name, verb, entry.state, entry.problem)
        for name in removed:
            logger.info("model '%s' removed from the repository", name)
        await self.sync()
        return True

    async def _settle(
        self, fresh: dict[str, ModelEntry], current: dict[str, ModelEntry], serving_only: bool = False
    ) -> tuple[dict[str, ModelEntry], dict[str, str]]:
        """What to publish for each ``fresh`` entry given the ``current`` ones (Redis): an
        unchanged one as it is; a changed one load-checked (:meth:`_checked`; with
        ``serving_only``, only where it replaces a serving entry) and settled by
        :func:`keep_last_good`. Also the failed changes, model -> what failed."""
        settled, failures = {}, {}
        for name, entry in fresh.items():
            previous = current.get(name)
            if previous == entry or (serving_only and (previous is None or not previous.ready)):
                settled[name] = entry
                continue
            candidate = await self._checked(entry)
            settled[name] = keep_last_good(previous, candidate)
            if candidate.problem:
                failures[name] = candidate.problem
                logger.warning("model '%s': the change failed: %s", name, candidate.problem)
        return settled, failures

    async def _count_failures(self, failures: dict[str, str]) -> None:
        """Count one load failure for each model of ``failures``."""
        if failures:
            async with self.redis.pipeline(transaction=False) as pipe:
                for name in failures:
                    telemetry.add_load_failure(pipe, name)
                await pipe.execute()

    async def _write(self, changed: dict[str, ModelEntry], removed: Sequence[str] = (),
                     failures: dict[str, str] | None = None) -> None:  # fmt: skip
        """Write ``changed`` entries, delete ``removed`` ones and bump the generation in one
        transaction, counting one load failure for each model of ``failures``."""
        async with self.redis.pipeline(transaction=True) as pipe:
            publish(pipe, changed, removed)
            await pipe.execute()
        await self._count_failures(failures or {})

    async def load(self, name: str, config: ModelConfig | None = None) -> ModelEntry:
        """Re-read model ``name`` from the repository (``config`` replacing its config.pbtxt),
        load it (and the composing models indexed with an ensemble) with ``load_check``, and
        publish the result, READY or UNAVAILABLE with the reason; a load that fails leaves
        what was serving serving (:func:`keep_last_good`), its ``reason`` saying why. The
        caller reads the failure in the returned entry's ``problem``. Raises ModelNotFound if
        the repository has no such model, RepositoryError when the check could not reach it."""
        entry = await asyncio.to_thread(index_model, self.store, name, config)
        entries = await self._with_composing({name: entry})
        current = await self._read(sorted(entries))
        failures = {}
        for key, candidate in sorted(entries.items()):
            candidate = await self._checked(candidate)
            if candidate.problem:
                failures[key] = candidate.problem
                logger.warning("model '%s' failed to load: %s", key, candidate.problem)
            entries[key] = keep_last_good(current.get(key), candidate)
        await self._write(entries, failures=failures)
        await self.sync()
        return self._entries.get(name, entries[name])  # an ensemble's: as its composing models allow

    async def _checked(self, entry: ModelEntry) -> ModelEntry:
        """``entry`` with each version that ``load_check`` fails moved to ``failed`` (all
        failed: UNAVAILABLE with the load error); each version is tried on its own."""
        if self.load_check is None or not entry.ready or is_ensemble(entry.config):
            return entry
        for version in list(entry.versions):
            reason = await self.load_check(replace(entry, versions=[version]))
            if reason is not None:
                entry = entry.load_failed(reason, version)
        return entry

    async def _with_composing(self, loaded: dict[str, ModelEntry]) -> dict[str, ModelEntry]:
        """``loaded`` plus the composing models of its ensembles (nested ones too) that are
        neither in it nor READY in the registry, indexed; a name the repository lacks is left
        out (the ensemble's reason will name it)."""
        todo = list(loaded.values())
        while todo:
            entry = todo.pop()
            if not is_ensemble(entry.config):
                continue
            for name in composing_models(entry.config):
                current = self._entries.get(name)
                if name in loaded or (current is not None and current.ready):
                    continue
                try:
                    loaded[name] = await asyncio.to_thread(index_model, self.store, name)
                except ModelNotFound:
                    continue
                todo.append(loaded[name])
        return loaded

    async def unload(self, name: str) -> ModelEntry:
        """Mark ``name`` UNAVAILABLE ("unloaded"); its workers see it and drain."""
        entry = await self.get(name)
        unloaded = ModelEntry(name, None, list(entry.versions), UNAVAILABLE, UNLOADED)
        await self._put(unloaded)
        return unloaded

    async def _put(self, entry: ModelEntry) -> None:
        await self._write({entry.name: entry})
        await self.sync()

    async def _read(self, names: list[str]) -> dict[str, ModelEntry]:
        """The Redis entries of ``names`` that exist."""
        return await self.reader.read_many(names)

    async def _read_all(self) -> dict[str, ModelEntry]:
        return await self.reader.read_all()

    async def sync(self) -> None:
        """Reload the local copy from Redis if the registry changed since (any gateway).
        A generation gone after this gateway indexed means Redis lost its data (restarted
        without persistence): the repository is indexed again, as at start."""
        self._synced_at = time.monotonic()
        found = await self.reader.generation()
        if found is None and self._generation:
            await self._rebuild()
            return
        generation = found or 0
        if generation == self._generation:
            return
        self._entries = resolve_ensembles(await self._read_all())
        self._rollbacks = await self._read_rollbacks()
        self._generation = generation

    async def _read_rollbacks(self) -> dict[str, dict[int, str]]:
        """The automatic rollbacks in force (:data:`naiad.keys.ROLLBACKS`), by model."""
        raw = await self.redis.hgetall(keys.ROLLBACKS)
        models = {field.decode(errors="replace").rpartition("/")[0] for field in raw}
        digests = {name: rollout.config_digest(self._entries[name].config) for name in models
                   if name in self._entries and self._entries[name].config is not None}  # fmt: skip
        return rollout.parse_rollbacks(raw, digests)

    def rolled_back(self, name: str) -> dict[int, str]:
        """Versions of ``name`` rolled back automatically under its current config, with why
        (as of the last sync)."""
        return self._rollbacks.get(name, {})

    async def _rebuild(self) -> None:
        """Index again after Redis lost the registry; concurrent callers wait for one
        rebuild (other gateways may rebuild too: each writes the same entries)."""
        async with self._rebuilding:
            if await self.reader.generation() is not None:
                self._generation = None  # rebuilt meanwhile: reload on the next sync
                self._synced_at = float("-inf")
                return
            logger.warning("the registry is gone from Redis (restarted empty?): indexing again")
            await self.start(*self._start_args)

    def expire(self) -> None:
        """Make the next :meth:`get` check the generation at once: a worker answered that
        its model failed to load, and it marks the registry before answering
        (:mod:`workers.load_failure`), so the next ``ready`` here says false."""
        self._synced_at = float("-inf")

    async def get(self, name: str) -> ModelEntry:
        if time.monotonic() - self._synced_at >= SYNC_INTERVAL_S:
            await self.sync()
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


async def poll_repository(registry: ModelRegistry, period_s: float) -> None:
    """Poll mode: :meth:`ModelRegistry.poll` every ``period_s`` until cancelled; an
    unreachable repository is logged and tried again next period."""
    while True:
        await asyncio.sleep(period_s)
        try:
            await registry.poll()
        except (RepositoryError, RedisError) as exc:
            logger.warning("repository poll failed: %s", exc)
