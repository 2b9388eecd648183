"""A poll costs what changed, not the repository's size: with nothing changed it re-indexes
(reads the config of) no model; after a change, exactly the changed one. Local and S3."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from naiad_harness import run_scenario, upload_tree

from gateway.registry import ModelRegistry
from repository_store import LocalStore, S3Store


class _Counting:
    """Counts the configs a store reads (the first step of indexing a model)."""

    reads: list[str]

    def read_config(self, model: str):
        self.reads.append(model)
        return super().read_config(model)


class CountingLocal(_Counting, LocalStore):
    pass


class CountingS3(_Counting, S3Store):
    pass


@pytest.fixture(params=["local", "s3"])
def counting_store(request, tmp_path: Path, example_repository: Path):
    local = Path(shutil.copytree(example_repository, tmp_path / "models"))
    for copy in ("digits_a", "digits_b"):
        shutil.copytree(local / "digits", local / copy)
        config = local / copy / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "digits"', f'name: "{copy}"'))
    if request.param == "local":
        store = CountingLocal(local)
    else:
        endpoint, bucket = request.getfixturevalue("s3_endpoint"), request.getfixturevalue("s3_bucket")
        upload_tree(endpoint, bucket, local, "repo")
        store = CountingS3(bucket, "repo", endpoint)
    store.reads = []
    return store


def test_poll_reindexes_only_changed_models(redis_url: str, counting_store, tmp_path: Path) -> None:
    store = counting_store

    async def scenario(redis) -> None:
        registry = ModelRegistry(redis, store)
        await registry.start("poll", [])
        assert sorted(store.reads) == ["digits", "digits_a", "digits_b", "silero_vad"]

        store.reads.clear()
        assert not await registry.poll()
        assert registry.last_poll_indexed == [] and store.reads == []

        labels = tmp_path / "labels.txt"
        labels.write_text("\n".join(f"class {i}" for i in range(10)) + "\n")
        store.put_file("digits_a", "labels.txt", labels)  # new content: a changed model
        assert await registry.poll()
        assert registry.last_poll_indexed == ["digits_a"] and store.reads == ["digits_a"]
        assert (await registry.get("digits_a")).labels["probabilities"][0] == "class 0"

        store.reads.clear()
        assert not await registry.poll()
        assert store.reads == []

    run_scenario(redis_url, scenario)
