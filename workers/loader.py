"""Pull and load the model versions a worker serves, each once, on first use.

The version folder comes from the machine's shared :class:`repository_store.ModelCache`
(downloaded aside, then renamed into place), and is loaded with the config's backend on the
device its ``instance_group`` asks for (KIND_CPU → CPU; otherwise CUDA where the backend has
it, falling back to the CPU).
"""

from __future__ import annotations

import asyncio
import logging
import time

from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import ModelNotFound, ModelNotReady
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


class VersionLoader:
    """The versions of one model this worker has loaded, by version number."""

    def __init__(self, settings: Settings, model: str):
        self.settings = settings
        self.model = model
        self.cache = ModelCache(settings.cache_dir, settings.cache_max_bytes)
        self.store: RepositoryStore | None = None
        self.entry: ModelEntry | None = None
        self._runners: dict[int, ModelRunner] = {}
        self._pulls: list[PullStats] = []
        self._lock = asyncio.Lock()

    async def start(self, entry: ModelEntry | None = None) -> ModelEntry:
        """Load the newest version of ``entry`` (the model's registry entry: the config and
        versions the gateways serve, a load request's config override included), or, without
        one, of what the repository holds now.

        Raises :class:`ModelNotReady` when the entry or the repository says it is not ready.
        """
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

    def _load(self, version: int) -> ModelRunner:
        assert self.entry is not None and self.entry.config is not None and self.store
        if version not in self.entry.versions:
            raise ModelNotFound(f"model '{self.model}' has no version {version}")
        started = time.perf_counter()
        folder = self.cache.ensure_version(self.store, self.model, version)
        pulled = time.perf_counter()
        if self.cache.last_pull is not None and self.cache.last_pull.downloaded:
            self._pulls.append(self.cache.last_pull)
        backend = load_backend(folder, self.entry.config, device_for(self.entry.config))
        logger.info(
            "model '%s' version %d: pulled in %.3f s, loaded in %.3f s",
            self.model, version, pulled - started, time.perf_counter() - pulled,
        )
        return ModelRunner(self.entry.config, backend)
