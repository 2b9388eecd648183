"""Last known good in the registry, on a real Redis, a local repository and the real load
probe (a child process loading each version): a failed explicit load or poll leaves what was
serving serving, per version, counted once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from naiad_harness import run_scenario as run

from gateway.load_probe import LoadProbe
from gateway.registry import ModelRegistry
from naiad import keys
from repository_store import open_store


@pytest.fixture
def repository(tmp_path: Path, example_repository: Path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(example_repository / "digits", root / "digits")
    return root


def registry_of(redis, repository: Path, tmp_path: Path) -> ModelRegistry:
    probe = LoadProbe(str(repository), tmp_path / "cache", 1 << 30)
    return ModelRegistry(redis, open_store(str(repository)), load_check=probe)


async def failures(redis) -> int:
    return int(await redis.hget(keys.lifecycle("digits"), "load_failures") or 0)


def test_a_failed_explicit_load_keeps_what_serves(redis_url: str, repository: Path, tmp_path: Path) -> None:
    config = repository / "digits" / "config.pbtxt"

    async def scenario(redis) -> None:
        registry = registry_of(redis, repository, tmp_path)
        await registry.start("explicit", [])
        assert (await registry.load("digits")).problem == ""
        good = await redis.hget(keys.REGISTRY, "digits")

        text = config.read_text()
        config.write_text("this is { not a config")
        kept = await registry.load("digits")
        assert kept.ready and kept.versions == [1] and "does not parse" in kept.problem
        assert kept.reason.startswith("reload failed (still serving version 1)")
        assert await failures(redis) == 1

        # A new version whose file does not load: version 1 keeps serving, version 2 failed.
        config.write_text(text.replace("max_batch_size", "version_policy { all { } }\nmax_batch_size"))
        (repository / "digits" / "2").mkdir()
        (repository / "digits" / "2" / "model.onnx").write_bytes(b"\x00 not a model")
        kept = await registry.load("digits")
        assert kept.ready and kept.versions == [1] and list(kept.failed) == [2]
        assert "version 2" in kept.failed[2] and await failures(redis) == 2
        assert not kept.config.version_policy.HasField("all")  # the loaded config, not the new one
        assert await redis.hget(keys.REGISTRY, "digits") != good  # the reason is recorded

        # Fixed: both versions serve, the reason is gone.
        version_dir = repository / "digits"
        shutil.copyfile(version_dir / "1" / "model.onnx", version_dir / "2" / "model.onnx")
        fixed = await registry.load("digits")
        assert (fixed.versions, fixed.failed, fixed.reason) == ([1, 2], {}, "")
        assert await failures(redis) == 2

    run(redis_url, scenario)


def test_every_gateways_poll_writes_a_failed_change_once(
    redis_url: str, repository: Path, tmp_path: Path
) -> None:
    async def scenario(redis) -> None:
        first, second = registry_of(redis, repository, tmp_path), registry_of(redis, repository, tmp_path)
        await first.start("poll", [])
        await second.start("poll", [])
        (repository / "digits" / "config.pbtxt").write_text("this is { not a config")
        assert await first.poll()  # the kept entry, with the reason
        generation = await redis.get(keys.REGISTRY_GENERATION)
        assert not await second.poll()  # the same result: nothing written
        assert await redis.get(keys.REGISTRY_GENERATION) == generation
        entry = await second.get("digits")
        assert entry.ready and entry.reason.startswith("reload failed") and await failures(redis) == 1

    run(redis_url, scenario)


def test_a_gateway_starting_during_a_bad_upload_keeps_what_serves(
    redis_url: str, repository: Path, tmp_path: Path
) -> None:
    async def scenario(redis) -> None:
        first = registry_of(redis, repository, tmp_path)
        await first.start("none", [])
        good = await first.get("digits")
        (repository / "digits" / "2").mkdir()
        (repository / "digits" / "2" / "model.onnx").write_bytes(b"\x00 not a model")
        restarted = registry_of(redis, repository, tmp_path)
        await restarted.start("none", [])  # its full index meets the serving entry
        entry = await restarted.get("digits")
        assert (entry.ready, entry.versions, entry.config) == (True, [1], good.config)
        assert list(entry.failed) == [2] and await failures(redis) == 1
        await first.sync()
        assert (await first.get("digits")).versions == [1]

        folder = repository / "digits"
        shutil.copyfile(folder / "1" / "model.onnx", folder / "2" / "model.onnx")
        again = registry_of(redis, repository, tmp_path)
        await again.start("none", [])
        assert (await again.get("digits")).versions == [2] and (await again.get("digits")).problem == ""

    run(redis_url, scenario)
