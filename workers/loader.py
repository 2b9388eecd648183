"""Pull and load the model versions a worker serves, each once, on first use.

The version folder comes from the machine's shared :class:`repository_store.ModelCache`
(downloaded aside, then renamed into place), and is loaded with the config's backend on the
device its ``instance_group`` asks for (KIND_CPU → CPU; otherwise CUDA where the backend has
it, falling back to the CPU).
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import time
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import ModelNotFound, ModelNotReady, RepositoryError
from naiad.settings import Settings
from repository_store import ModelCache, ModelEntry, RepositoryStore, index_model, open_store
from repository_store.cache import PullStats
from workers.backends import load_backend
from workers.model import ModelRunner

logger = logging.getLogger(__name__)


def device_for(config: mc.ModelConfig) -> str:
    """``cpu`` when every instance group is KIND_CPU, else ``cuda`` (backends fall back)."""
    kinds = {group.kind for group in config.instance_group}
    return "cpu" if kinds == {mc.ModelInstanceGroup.KIND_CPU} else "cuda"


@dataclass(frozen=True)
class VersionLoad:
    """How long one version took to become servable: ``pull_s`` (the local cache's check,
    plus the download when it was not there) and ``load_s`` (the backend's load)."""

    version: int
    pull_s: float
    load_s: float


class VersionLoader:
    """The versions of one model this worker has loaded, by version number. ``store``: the
    repository already opened (a warm-pool process opens it before its claim), else opened
    by :meth:`start`."""

    def __init__(self, settings: Settings, model: str, store: RepositoryStore | None = None):
        self.settings = settings
        self.model = model
        self.cache = ModelCache(settings.cache_dir, settings.cache_max_bytes)
        self.store = store
        self.entry: ModelEntry | None = None
        self._runners: dict[int, ModelRunner] = {}
        self._pulls: list[PullStats] = []
        self._loads: list[VersionLoad] = []
        self._lock = asyncio.Lock()

    async def start(self, entry: ModelEntry | None = None) -> ModelEntry:
        """Load the newest version of ``entry`` (the model's registry entry: the config and
        versions the gateways serve, a load request's config override included), or, without
        one, of what the repository holds now.

        Raises :class:`ModelNotReady` when the entry or the repository says it is not ready.
        """
        if self.store is None:
            self.store = await asyncio.to_thread(open_store, self.settings.model_repository)
        if entry is None:
            entry = await asyncio.to_thread(index_model, self.store, self.model)
        self.entry = entry
        if self.entry.state != "READY" or self.entry.config is None:
            raise ModelNotReady(f"model '{self.model}' is not ready: {self.entry.reason}")
        await self.get(max(self.entry.versions))
        return self.entry

    async def get(self, version: int) -> ModelRunner:
        """The runner of ``version``, pulled and loaded on first use."""
        runner = self._runners.get(version)
        if runner is not None:
            return runner
        async with self._lock:
            if version not in self._runners:
                self._runners[version] = await asyncio.to_thread(self._load, version)
        return self._runners[version]

    def take_pulls(self) -> list[PullStats]:
        """The downloads from the repository since the last call (a version found in the
        local cache is none), for the worker to record."""
        pulls, self._pulls = self._pulls, []
        return pulls

    def take_loads(self) -> list[VersionLoad]:
        """The versions loaded since the last call, with their pull and load times."""
        loads, self._loads = self._loads, []
        return loads

    def _pull(self, version: int) -> pathlib.Path:
        """The version's local folder (a complete cached copy serves even when the store is
        down). A repository failure is tried ``pull_attempts`` times, waiting
        ``pull_backoff_s`` and twice as long before each next try; then RepositoryError
        (503) names the version, the repository and the last error."""
        assert self.store is not None
        attempts, wait_s = self.settings.pull_attempts, self.settings.pull_backoff_s
        for attempt in range(1, attempts + 1):
            try:
                return self.cache.ensure_version(self.store, self.model, version)
            except RepositoryError as exc:
                if attempt == attempts:
                    raise RepositoryError(
                        f"model '{self.model}' version {version} could not be pulled from "
                        f"{self.store.uri} ({attempts} attempts): {exc.message}"
                    ) from None
                logger.warning("pulling model '%s' version %d failed (attempt %d of %d), "
                               "retrying in %.1f s: %s", self.model, version, attempt, attempts,
                               wait_s, exc.message)  # fmt: skip
                time.sleep(wait_s)
                wait_s *= 2
        raise AssertionError("unreachable")

    def _load(self, version: int) -> ModelRunner:
        assert self.entry is not None and self.entry.config is not None and self.store
        if version not in self.entry.versions:
            raise ModelNotFound(f"model '{self.model}' has no version {version}")
        started = time.perf_counter()
        folder = self._pull(version)
        pulled = time.perf_counter()
        if self.cache.last_pull is not None and self.cache.last_pull.downloaded:
            self._pulls.append(self.cache.last_pull)
        backend = load_backend(folder, self.entry.config, device_for(self.entry.config))
        loaded = time.perf_counter()
        self._loads.append(VersionLoad(version, pulled - started, loaded - pulled))
        logger.info(
            "model '%s' version %d: pulled in %.3f s, loaded in %.3f s",
            self.model, version, pulled - started, loaded - pulled,
        )
        return ModelRunner(self.entry.config, backend)
