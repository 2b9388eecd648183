"""Rollback decisions at the gateway (gateway/rollouts.py) on a real Redis and registry: a
canary's failures roll it back once, every gateway (one started later too) routes around it,
a changed config ends it; client errors and capacity refusals never count."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import pytest
from naiad_harness import run_scenario as run

from gateway.registry import ModelRegistry
from gateway.rollouts import Rollouts, counts_against_version
from naiad import keys
from naiad.errors import (
    DeadlineExceeded,
    InferenceFailed,
    InvalidInput,
    ModelNotReady,
    Overloaded,
    QueueTimeout,
)
from repository_store import open_store


def write_config(repository: Path, parameters: dict[str, str]) -> None:
    config = repository / "digits" / "config.pbtxt"
    text = config.read_text().split("\n# rollout\n")[0]
    extra = "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
                    for k, v in parameters.items())  # fmt: skip
    config.write_text(f"{text}\n# rollout\nversion_policy {{ all {{ }} }}\n{extra}")


@pytest.fixture
def repository(tmp_path: Path, example_repository: Path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(example_repository / "digits", root / "digits")
    shutil.copytree(root / "digits" / "1", root / "digits" / "2")
    return root


async def gateway(redis, repository: Path) -> tuple[ModelRegistry, Rollouts]:
    registry = ModelRegistry(redis, open_store(str(repository)))
    await registry.start("none", [])
    return registry, Rollouts(redis, registry)


def test_which_failures_count() -> None:
    assert counts_against_version(InferenceFailed("boom"))
    assert counts_against_version(DeadlineExceeded("slow"))
    assert counts_against_version(ModelNotReady("no")) and counts_against_version(RuntimeError("?"))
    for refusal in (InvalidInput("bad"), Overloaded("full"), QueueTimeout("queue"), asyncio.CancelledError()):
        assert not counts_against_version(refusal)


def test_an_invalid_split_is_ignored_with_one_warning(redis_url, repository, caplog) -> None:
    write_config(repository, {"naiad.traffic_split": "1:90,2:20"})

    async def scenario(redis) -> None:
        registry, rollouts = await gateway(redis, repository)
        entry = await registry.get("digits")
        with caplog.at_level(logging.WARNING, "gateway.rollouts"):
            assert {rollouts.route(entry, None) for _ in range(50)} == {2}  # the newest
        assert [r.getMessage() for r in caplog.records] == [
            "model 'digits': parameter naiad.traffic_split='1:90,2:20' ignored: "
            "the weights sum to 110, not 100"
        ]

    run(redis_url, scenario)


def test_a_failing_canary_is_rolled_back_once_for_every_gateway(redis_url, repository) -> None:
    write_config(repository, {"naiad.traffic_split": "1:50,2:50", "naiad.rollback_error_rate": "0.2",
                              "naiad.rollback_min_requests": "10"})  # fmt: skip

    async def scenario(redis) -> None:
        registry, rollouts = await gateway(redis, repository)
        entry = await registry.get("digits")
        assert {rollouts.route(entry, None) for _ in range(100)} == {1, 2}
        for _ in range(20):  # client errors and a full queue say nothing about the version
            rollouts.observe(entry, 2, InvalidInput("bad input"))
            rollouts.observe(entry, 2, QueueTimeout("full"))
        for _ in range(7):
            rollouts.observe(entry, 2, None)
        for _ in range(2):
            rollouts.observe(entry, 2, InferenceFailed("boom"))
        rollouts.observe(entry, 1, InferenceFailed("boom"))
        await rollouts.close()
        assert await redis.hlen(keys.ROLLBACKS) == 0  # 2 of 9: under the minimum of 10
        rollouts.observe(entry, 2, InferenceFailed("boom"))  # 3 of 10 > 0.2
        await rollouts.close()
        assert await redis.hget(keys.lifecycle("digits"), "rollbacks:2") == b"1"
        await registry.sync()
        reason = registry.rolled_back("digits")[2]
        assert reason.startswith("rolled back automatically: failure ratio 0.300")
        assert {rollouts.route(entry, None) for _ in range(100)} == {1}
        assert {rollouts.route(entry, f"user-{i}") for i in range(30)} == {1}

        # A gateway started later reads the decision; its own failures do not count it again.
        later_registry, later = await gateway(redis, repository)
        later_entry = await later_registry.get("digits")
        assert {later.route(later_entry, None) for _ in range(50)} == {1}
        for _ in range(10):
            later.observe(later_entry, 1, InferenceFailed("boom"))  # the last version left stays
            later.observe(later_entry, 2, InferenceFailed("boom"))
        await later.close()
        assert await redis.hget(keys.lifecycle("digits"), "rollbacks:2") == b"1"
        assert set(later_registry.rolled_back("digits")) == {2}

        # A changed config ends the decision.
        write_config(repository, {"naiad.traffic_split": "1:60,2:40"})
        await later_registry.index()
        assert later_registry.rolled_back("digits") == {}
        assert {later.route(await later_registry.get("digits"), None) for _ in range(100)} == {1, 2}

    run(redis_url, scenario)
