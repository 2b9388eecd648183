"""A model whose load fails in a worker is marked UNAVAILABLE in the registry with the load
error (:mod:`workers.load_failure`), on a real Redis with real ``naiad worker`` processes:
only for a fault in the model (never for a repository that is down), only over the entry the
worker tried (compare-and-set), and a poll brings it back only when its files change."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from naiad_harness import free_port
from naiad_harness import run_scenario as run

from gateway.registry import ModelRegistry
from naiad import keys
from naiad.errors import (
    ConfigError,
    DeadlineExceeded,
    InferenceFailed,
    ModelNotFound,
    ModelNotReady,
    RepositoryError,
    Unavailable,
    Unsupported,
)
from naiad.registry import ModelEntry
from repository_store import open_store
from workers.load_failure import is_model_fault, mark_unavailable

ROOT = Path(__file__).resolve().parents[2]
LOAD_ERROR = "unable to load model 'digits' version 1 (onnxruntime)"


@pytest.fixture
def repository(tmp_path: Path, example_repository: Path) -> Path:
    return Path(shutil.copytree(example_repository, tmp_path / "models"))


@pytest.mark.parametrize(
    ("error", "marks"),
    [
        (ModelNotReady("unable to load model 'm' version 1 (pytorch): bad file"), True),
        (ModelNotReady("model 'm' version 1 failed to load: warmup sample 'w' failed"), True),
        (Unsupported("backend 'tensorflow' is not installed in this worker"), True),
        (ConfigError("input 'x' has no dims"), True),
        (RepositoryError("model 'm' version 1 could not be pulled from s3://b/p (4 attempts)"), False),
        (Unavailable("redis is down"), False),
        (DeadlineExceeded("timed out"), False),
        (ModelNotFound("model 'm' has no version 3"), False),
        (InferenceFailed("inference failed: boom"), False),
    ],
)
def test_only_a_fault_in_the_model_marks_it(error, marks):
    assert is_model_fault(error) is marks


async def generation(redis) -> int:
    return int(await redis.get(keys.REGISTRY_GENERATION))


def test_the_mark_replaces_only_the_entry_tried(redis_url: str, repository: Path) -> None:
    async def scenario(redis) -> None:
        registry = ModelRegistry(redis, open_store(str(repository)))
        await registry.start("none", [])
        tried = await redis.hget(keys.REGISTRY, "digits")
        newer = ModelEntry.from_bytes(tried)
        newer.config.dynamic_batching.max_queue_delay_microseconds = 7  # a load meanwhile
        await redis.hset(keys.REGISTRY, "digits", newer.to_bytes())
        before = await generation(redis)

        assert not await mark_unavailable(redis, tried, "stale failure")
        assert await redis.hget(keys.REGISTRY, "digits") == newer.to_bytes()
        assert await generation(redis) == before

        assert await mark_unavailable(redis, newer.to_bytes(), "version 1 does not load")
        assert await generation(redis) == before + 1
        await registry.sync()  # the generation moved: the copy reloads
        entry = await registry.get("digits")
        assert (entry.state, entry.reason, entry.versions) == ("UNAVAILABLE", "version 1 does not load", [1])
        assert entry.config == newer.config  # the index still names what was tried
        assert (await registry.get("silero_vad")).ready  # the others are untouched

    run(redis_url, scenario)


def worker(redis_url: str, repository: str, cache: Path, **env: str) -> subprocess.CompletedProcess:
    """One ``naiad worker --model digits`` run to its end (a failed load exits 2)."""
    command = [sys.executable, "-m", "naiad_cli", "worker", "--model", "digits", "--model-repository",
               repository, "--redis-url", redis_url, "--cache-dir", str(cache)]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def test_a_worker_whose_load_fails_marks_the_model_until_its_files_change(
    redis_url: str, repository: Path, tmp_path: Path
) -> None:
    model_file = repository / "digits" / "1" / "model.onnx"
    good = model_file.read_bytes()
    model_file.write_bytes(b"\x00 not a model " * 8)

    async def scenario(redis) -> None:
        registry = ModelRegistry(redis, open_store(str(repository)))
        await registry.start("poll", [])
        assert (await registry.get("digits")).ready  # the index sees files, not their contents
        before = await generation(redis)

        done = await asyncio.to_thread(worker, redis_url, str(repository), tmp_path / "cache")
        assert done.returncode == 2, done.stderr[-2000:]
        assert "marked UNAVAILABLE" in done.stderr
        assert await generation(redis) == before + 1
        await registry.sync()
        entry = await registry.get("digits")
        assert entry.state == "UNAVAILABLE" and entry.reason.startswith(LOAD_ERROR), entry.reason

        for _ in range(2):  # polls that find nothing changed leave it so
            assert not await registry.poll()
        assert not (await registry.get("digits")).ready

        # a second worker (a straggling request's) finds it unavailable: no second mark
        again = await asyncio.to_thread(worker, redis_url, str(repository), tmp_path / "cache")
        assert again.returncode == 2 and "marked UNAVAILABLE" not in again.stderr
        assert await generation(redis) == before + 1

        model_file.write_bytes(good)  # fixed: a poll re-indexes it
        assert await registry.poll()
        assert (await registry.get("digits")).ready

    run(redis_url, scenario)


def test_a_repository_that_is_down_does_not_mark_the_model(
    redis_url: str, repository: Path, tmp_path: Path
) -> None:
    """The registry was indexed from the repository; the worker's pull from an S3 endpoint
    that does not answer fails with a 503: transient, so the entry stays READY."""

    async def scenario(redis) -> None:
        registry = ModelRegistry(redis, open_store(str(repository)))
        await registry.start("none", [])
        entry, before = await redis.hget(keys.REGISTRY, "digits"), await generation(redis)

        down = f"s3://127.0.0.1:{free_port()}/models/repo"
        env = {"NAIAD_PULL_ATTEMPTS": "1", "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
        done = await asyncio.to_thread(worker, redis_url, down, tmp_path / "cache", **env)
        assert done.returncode == 2, done.stderr[-2000:]
        assert "could not be pulled" in done.stderr
        assert await redis.hget(keys.REGISTRY, "digits") == entry
        assert await generation(redis) == before

    run(redis_url, scenario)
