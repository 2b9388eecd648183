"""The model registry's model control on a real Redis and a local repository: polls write
only what changed, explicit mode's start keeps what another gateway loaded, unloads are seen
by every registry that syncs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from naiad_harness import run_scenario as run

from gateway.registry import ModelRegistry
from naiad import keys
from naiad.errors import ModelNotFound
from naiad.registry import ModelEntry
from repository_store import open_store


@pytest.fixture
def repository(tmp_path: Path, example_repository: Path) -> Path:
    return Path(shutil.copytree(example_repository, tmp_path / "models"))


async def _generation(redis) -> int:
    return int(await redis.get(keys.REGISTRY_GENERATION))


def test_poll_writes_only_what_changed(redis_url: str, repository: Path) -> None:
    async def scenario(redis) -> None:
        registry = ModelRegistry(redis, open_store(str(repository)))
        await registry.start("poll", [])
        generation, digits = await _generation(redis), await redis.hget(keys.REGISTRY, "digits")

        assert not await registry.poll()  # nothing changed: nothing written
        assert await _generation(redis) == generation

        shutil.rmtree(repository / "silero_vad")
        (repository / "broken").mkdir()
        assert await registry.poll()
        assert await _generation(redis) == generation + 1
        assert sorted(await redis.hkeys(keys.REGISTRY)) == [b"broken", b"digits"]
        assert await redis.hget(keys.REGISTRY, "digits") == digits
        assert (await registry.get("broken")).reason.startswith("missing config.pbtxt")
        with pytest.raises(ModelNotFound):
            await registry.get("silero_vad")

    run(redis_url, scenario)


def test_explicit_start_load_and_unload_across_registries(redis_url: str, repository: Path) -> None:
    async def scenario(redis) -> None:
        first = ModelRegistry(redis, open_store(str(repository)))
        await first.start("explicit", ["digits"])
        assert (await first.get("digits")).ready
        assert (await first.get("silero_vad")).reason == "unloaded"

        # A second gateway starting with no --load-model keeps what the first one loaded.
        second = ModelRegistry(redis, open_store(str(repository)))
        await second.start("explicit", [])
        assert (await second.get("digits")).ready

        await first.unload("digits")
        await second.sync()
        entry = await second.get("digits")
        assert (entry.state, entry.reason, entry.versions) == ("UNAVAILABLE", "unloaded", [1])
        assert (await second.load("silero_vad")).ready
        await first.sync()
        assert (await first.get("silero_vad")).ready
        raw = await redis.hget(keys.REGISTRY, "silero_vad")
        assert ModelEntry.from_bytes(raw).ready
        with pytest.raises(ModelNotFound):
            await first.load("nonexistent")

    run(redis_url, scenario)


def test_explicit_start_with_star_loads_everything(redis_url: str, repository: Path) -> None:
    async def scenario(redis) -> None:
        registry = ModelRegistry(redis, open_store(str(repository)))
        await registry.start("explicit", ["*"])
        assert [e.name for e in registry.entries() if e.ready] == ["digits", "silero_vad"]

    run(redis_url, scenario)
