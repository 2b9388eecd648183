"""The model registry in Redis: what every process knows of the indexed models, in one place.

Layout (:mod:`naiad.keys`): the hash :data:`~naiad.keys.REGISTRY` maps each model name to its
:class:`ModelEntry` (msgpack, the config as protobuf wire bytes), and the counter
:data:`~naiad.keys.REGISTRY_GENERATION` is bumped by every write, so a reader that saw the
same generation knows nothing changed (one ``GET``).

- **Reading** (every process: gateways, workers, the scaler, BLS, ``naiad status``):
  :class:`RegistryReader`; :class:`RegistryView` is a local copy refreshed only when the
  generation moved. A malformed entry is skipped with a warning, in every process alike.
- **Writing**: :func:`publish` (the gateways' index, load, unload, poll: entries written or
  removed and the generation bumped in one transaction) and :func:`compare_and_set` (a worker
  or the scaler marking the exact entry it tried as failed, :mod:`workers.load_failure`).
- **Version rules** a request meets (:func:`select_version`): the same for a client's request
  at the gateway and a Python model's BLS request in a worker.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import msgpack
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from tritonclient.grpc.model_config_pb2 import ModelConfig

from naiad import keys
from naiad.errors import InvalidInput, ModelNotFound, ModelNotReady

logger = logging.getLogger(__name__)

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
#: ``reason`` of a model that explicit mode has not loaded, or that was unloaded.
UNLOADED = "unloaded"


@dataclass
class ModelEntry:
    """One model of the repository. ``versions`` are those selected by the version policy
    (ascending; those found so far when unavailable); ``reason`` explains UNAVAILABLE."""

    name: str
    config: ModelConfig | None
    versions: list[int] = field(default_factory=list)
    state: str = UNAVAILABLE
    reason: str = ""
    labels: dict[str, list[str]] = field(default_factory=dict)
    """Class labels by output name, from each output's ``label_filename`` (one per line)."""
    failed: dict[int, str] = field(default_factory=dict)
    """Versions the policy selects that cannot serve (model file missing, load error), with
    the reason; never in ``versions``. Triton keeps serving the versions that loaded."""

    @property
    def ready(self) -> bool:
        return self.state == READY

    @property
    def problem(self) -> str:
        """Why this entry is not everything it was asked to be: the model's ``reason`` (not
        ready, or a change that failed while the previous one keeps serving), else its failed
        versions' reasons; "" when every selected version serves."""
        return self.reason or "; ".join(self.failed[v] for v in sorted(self.failed))

    def load_failed(self, reason: str, version: int | None = None) -> ModelEntry:
        """This entry with ``version`` failed with ``reason`` (a worker or a load check could
        not load it: the backend's error, a failing ``model_warmup`` sample): the version
        leaves ``versions`` for ``failed`` and the others keep serving (Triton keeps the
        versions that loaded). With no version given, or none left, the model is UNAVAILABLE
        with ``reason``; config and versions stay, so the index still names the version tried.
        The next load, or changed files in poll mode, index the model afresh (Triton: a model
        whose load failed stays UNAVAILABLE until loaded again, model_management.md)."""
        if version is None or set(self.versions) <= {version}:
            return replace(self, state=UNAVAILABLE, reason=reason)
        versions = [v for v in self.versions if v != version]
        return replace(self, versions=versions, failed={**self.failed, version: reason})

    def to_bytes(self) -> bytes:
        """msgpack encoding; the config travels as its protobuf wire bytes."""
        return msgpack.packb(
            {
                "name": self.name,
                "config": self.config.SerializeToString() if self.config is not None else None,
                "versions": list(self.versions),
                "state": self.state,
                "reason": self.reason,
                "labels": self.labels,
                "failed": {str(v): why for v, why in self.failed.items()},
            },
            use_bin_type=True,
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> ModelEntry:
        """Inverse of :meth:`to_bytes`. Raises ``ValueError`` on malformed data."""
        try:
            raw = msgpack.unpackb(data, raw=False)
            config = None
            if raw["config"] is not None:
                config = ModelConfig()
                config.ParseFromString(raw["config"])
            return cls(
                raw["name"], config, list(raw["versions"]), raw["state"], raw["reason"],
                dict(raw.get("labels") or {}),
                {int(v): str(why) for v, why in (raw.get("failed") or {}).items()},
            )
        except (KeyError, TypeError, msgpack.UnpackException, ValueError) as exc:
            raise ValueError(f"malformed model entry: {exc}") from None


class RegistryReader:
    """Reads the registry (module docstring) through ``redis``."""

    def __init__(self, redis: Redis):
        self.redis = redis

    async def generation(self) -> int | None:
        """The generation counter; None when Redis holds no registry (restarted empty)."""
        raw = await self.redis.get(keys.REGISTRY_GENERATION)
        return int(raw) if raw is not None else None

    async def read(self, name: str) -> tuple[ModelEntry | None, bytes | None]:
        """Model ``name``'s entry and its bytes as stored (what :func:`compare_and_set`
        compares against); ``(None, None)`` for a model the registry does not hold.
        Raises ``ValueError`` for a malformed entry."""
        raw = await self.redis.hget(keys.REGISTRY, name) if name else None
        return (ModelEntry.from_bytes(raw), raw) if raw is not None else (None, None)

    async def get(self, name: str) -> ModelEntry | None:
        """Model ``name``'s entry, None when absent (or malformed, with a warning)."""
        try:
            return (await self.read(name))[0]
        except ValueError as exc:
            logger.warning("registry entry of '%s' skipped: %s", name, exc)
            return None

    async def read_many(self, names: Sequence[str]) -> dict[str, ModelEntry]:
        """The entries of ``names`` that exist (malformed ones skipped, with a warning)."""
        if not names:
            return {}
        raw = await self.redis.hmget(keys.REGISTRY, list(names))
        return _decoded({n: v for n, v in zip(names, raw, strict=True) if v is not None})

    async def read_all(self) -> dict[str, ModelEntry]:
        """Every entry, by model name (malformed ones skipped, with a warning)."""
        raw = await self.redis.hgetall(keys.REGISTRY)
        return _decoded({name.decode(): value for name, value in raw.items()})

    async def names(self) -> set[str]:
        """The names of the models the registry holds."""
        return {name.decode() for name in await self.redis.hkeys(keys.REGISTRY)}


class RegistryView:
    """A local copy of every entry, read again only when the generation moved."""

    def __init__(self, reader: RegistryReader):
        self.reader = reader
        self.entries: dict[str, ModelEntry] = {}
        self.generation: int | None = None
        self._fresh = False

    async def refresh(self) -> bool:
        """Read the entries again if the generation moved since the last read (one ``GET``
        when it did not); True when it read them."""
        generation = await self.reader.generation()
        if self._fresh and generation == self.generation:
            return False
        self.entries, self.generation, self._fresh = await self.reader.read_all(), generation, True
        return True

    def invalidate(self) -> None:
        """Read again on the next :meth:`refresh`, whatever the generation says."""
        self._fresh = False


def _decoded(raw: Mapping[str, bytes]) -> dict[str, ModelEntry]:
    entries = {}
    for name, value in raw.items():
        try:
            entries[name] = ModelEntry.from_bytes(value)
        except ValueError as exc:
            logger.warning("registry entry of '%s' skipped: %s", name, exc)
    return entries


def publish(
    pipe: Pipeline, changed: Mapping[str, ModelEntry], removed: Sequence[str] = (), *,
    replace_all: bool = False, unless_present: Mapping[str, ModelEntry] | None = None,
) -> None:  # fmt: skip
    """Queue on ``pipe`` (a transaction: readers see all of it or none) the ``changed``
    entries, the removal of ``removed``, and the generation bump, whose result (the new
    generation) comes last. ``replace_all``: drop every other entry first (a full index);
    ``unless_present``: entries written only where the model has none (explicit mode's
    "unloaded" placeholders, which never hide another gateway's load)."""
    if replace_all:
        pipe.delete(keys.REGISTRY)
    for name, entry in (unless_present or {}).items():
        pipe.hsetnx(keys.REGISTRY, name, entry.to_bytes())
    if changed:
        pipe.hset(keys.REGISTRY, mapping={n: e.to_bytes() for n, e in changed.items()})
    if removed:
        pipe.hdel(keys.REGISTRY, *removed)
    pipe.incr(keys.REGISTRY_GENERATION)


#: KEYS: the registry hash, its generation counter. ARGV: model, the entry tried (bytes), the
#: entry to write. Writes and bumps only while the hash still holds the entry tried.
COMPARE_AND_SET_LUA = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('INCR', KEYS[2])
return 1
"""


async def compare_and_set(redis: Redis, tried: bytes, entry: ModelEntry) -> bool:
    """Replace the entry whose stored bytes are ``tried`` by ``entry`` and bump the
    generation, atomically; False, writing nothing, when the registry holds anything else
    for that model by now (a load or re-index replaced it meanwhile)."""
    written = await redis.eval(
        COMPARE_AND_SET_LUA, 2, keys.REGISTRY, keys.REGISTRY_GENERATION, entry.name, tried, entry.to_bytes()
    )  # fmt: skip
    return bool(written)


def select_version(entry: ModelEntry, version: int | None) -> int:
    """The version a request for ``entry`` runs on: ``version``, or with None the newest the
    policy serves (Triton's empty version, BLS's -1). Raises :class:`ModelNotFound` for a
    model unloaded in explicit mode (Triton answers NOT_FOUND) or a version it does not serve,
    :class:`ModelNotReady` for a model or version that cannot serve, with the reason."""
    name = entry.name
    if not entry.ready and entry.reason == UNLOADED:
        raise ModelNotFound(f"Request for unknown model: '{name}' is not found ({UNLOADED})")
    if not entry.ready or entry.config is None:
        raise ModelNotReady(f"model '{name}' is not ready: {entry.reason}")
    if version is None:
        return max(entry.versions)
    failed = entry.failed.get(version)
    if failed is not None:
        raise ModelNotReady(f"model '{name}' version {version} is not ready: {failed}")
    if version not in entry.versions:
        raise ModelNotFound(f"Request for unknown model: '{name}' version {version} is not found")
    return version


def parse_version(text: str) -> int | None:
    """A version as a URL or message carries it: "" is None (the newest); else a positive
    integer, or :class:`InvalidInput`."""
    if not text:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise InvalidInput(f"model version must be a positive integer, got '{text}'")
    return int(text)
