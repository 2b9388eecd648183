"""Pull and load the model versions a worker serves, each once, on first use.

The version folder comes from the machine's shared :class:`repository_store.ModelCache`
(downloaded aside, then renamed into place), and is loaded with the config's backend on the
device the scaler placed this worker on (``Settings.device``), else the one its
``instance_group`` asks for (KIND_CPU → CPU; otherwise CUDA where the backend has it, falling
back to the CPU). Then its ``model_warmup`` samples run (:mod:`workers.warmup`), before the
worker takes a request; a failing sample fails the load. The pull runs in a thread of
asyncio's executor; the load and warm-up in the model's thread (:mod:`workers.model_thread`;
a Python model's: the event loop's own, :func:`runs_on_loop`), where its batches and its
``close`` run too: a Python model's ``initialize``, ``execute`` and ``finalize`` share one
thread, as in Triton's stub.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import time
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import ModelNotFound, ModelNotReady, RepositoryError
from naiad.registry import ModelEntry
from naiad.settings import Settings
from repository_store import ModelCache, RepositoryStore, backend_of, index_model, open_store
from repository_store.cache import PullStats
from workers import ort_spinning, rate_limiter
from workers.backends import load_backend
from workers.model import ModelRunner
from workers.model_thread import ModelThread
from workers.warmup import WarmupFailed, run_warmup

logger = logging.getLogger(__name__)


def device_for(config: mc.ModelConfig, placed: str | None = None) -> str:
    """The backend's device, ``cpu`` or ``cuda``. ``placed``: where the scaler put this worker
    (``cpu``, or ``gpu:<i>``, the one GPU its ``CUDA_VISIBLE_DEVICES`` leaves: ``cuda``).
    Without it: ``cpu`` when every instance group is KIND_CPU, else ``cuda`` (backends fall
    back to the CPU where CUDA is missing)."""
    if placed:
        return "cpu" if placed == "cpu" else "cuda"
    kinds = {group.kind for group in config.instance_group}
    return "cpu" if kinds == {mc.ModelInstanceGroup.KIND_CPU} else "cuda"


def runs_on_loop(config: mc.ModelConfig, settings: Settings) -> bool:
    """Whether the model's calls run on the worker's event loop's thread
    (:attr:`workers.model_thread.ModelThread.on_loop`): a Python model's (``--python-on-loop``,
    default true), unless the rate limiter may hold its batches (its leases renew on the loop)."""
    python = settings.python_on_loop and backend_of(config) == "python"
    return python and not rate_limiter.may_limit(settings, config)


@dataclass(frozen=True)
class VersionLoad:
    """How long one version took to become servable: ``pull_s`` (the local cache's check,
    plus the download when it was not there), ``load_s`` (the backend's load) and
    ``warmup_s`` (its ``model_warmup`` samples)."""

    version: int
    pull_s: float
    load_s: float
    warmup_s: float = 0.0


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
        #: The model's thread: its versions' imports, ``initialize`` and warm-up run there,
        #: as do its batches (:class:`workers.execution.BatchExecutor`) and ``close``.
        self.thread = ModelThread()

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
        self.thread.on_loop = runs_on_loop(self.entry.config, self.settings)
        if backend_of(self.entry.config) == "python" and not self.settings.onnxruntime_spinning:
            ort_spinning.install()  # before the model's file is imported
        await self.get(max(self.entry.versions))
        return self.entry

    def loaded(self, version: int) -> ModelRunner | None:
        """The runner of ``version`` when it is loaded already, else None."""
        return self._runners.get(version)

    async def get(self, version: int) -> ModelRunner:
        """The runner of ``version``, pulled and loaded on first use."""
        runner = self._runners.get(version)
        if runner is not None:
            return runner
        async with self._lock:
            if version not in self._runners:
                folder, pull_s = await asyncio.to_thread(self._fetch, version)  # never a loop's stall
                self._runners[version] = await self.thread.run(self._load, version, folder, pull_s)
        return self._runners[version]

    def close(self) -> None:
        """Close every loaded version's backend that has a ``close()`` (a Python model's
        ``finalize``), once, when the worker exits; an error is logged, never raised."""
        runners, self._runners = list(self._runners.values()), {}
        for runner in runners:
            close = getattr(runner.backend, "close", None)
            if not callable(close):
                continue
            try:
                close()
            except Exception:
                logger.exception("closing a version of model '%s' failed", self.model)

    def has_news(self) -> bool:
        """Whether pulls or loads wait to be taken (:meth:`take_pulls`, :meth:`take_loads`)."""
        return bool(self._pulls or self._loads)

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

    def _fetch(self, version: int) -> tuple[pathlib.Path, float]:
        """The version's local folder (:meth:`_pull`) and the seconds its pull took."""
        assert self.entry is not None
        if version not in self.entry.versions:
            raise ModelNotFound(f"model '{self.model}' has no version {version}")
        started = time.perf_counter()
        folder = self._pull(version)
        if self.cache.last_pull is not None and self.cache.last_pull.downloaded:
            self._pulls.append(self.cache.last_pull)
        return folder, time.perf_counter() - started

    def _load(self, version: int, folder: pathlib.Path, pull_s: float) -> ModelRunner:
        """Load and warm up the pulled ``version`` (in the model's thread)."""
        assert self.entry is not None and self.entry.config is not None and self.store
        pulled = time.perf_counter()
        device = device_for(self.entry.config, self.settings.device)
        backend = load_backend(folder, self.entry.config, device)
        loaded = time.perf_counter()
        runner = ModelRunner(self.entry.config, backend)
        warmup_s = self._warm_up(runner, version)
        self._loads.append(VersionLoad(version, pull_s, loaded - pulled, warmup_s))
        logger.info(
            "model '%s' version %d: pulled in %.3f s, loaded on %s in %.3f s, warmed up in %.3f s",
            self.model, version, pull_s, self.settings.device or device, loaded - pulled, warmup_s,
        )  # fmt: skip
        return runner

    def _warm_up(self, runner: ModelRunner, version: int) -> float:
        """Run the version's warmup samples (seconds taken); ModelNotReady when one fails."""
        if not runner.config.model_warmup:
            return 0.0
        assert self.store is not None
        try:
            return run_warmup(runner, lambda path: self.store.read_model_file(self.model, path))
        except WarmupFailed as exc:
            close = getattr(runner.backend, "close", None)
            if callable(close):  # a Python model's finalize
                close()
            raise ModelNotReady(f"model '{self.model}' version {version} failed to load: {exc}") from None
