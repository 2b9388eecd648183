"""An ensemble's readiness follows its composing models in the registry (real Redis, local
repository): a composing model removed, unloaded or back changes the ensemble's state on the
next sync; in explicit mode, loading an ensemble loads its composing models too (Triton)."""

from __future__ import annotations

import shutil
from pathlib import Path

from naiad_harness import run_scenario as run

from gateway.load_probe import LoadProbe
from gateway.registry import ModelRegistry
from repository_store import open_store

MODEL = """
name: "simple" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
ENSEMBLE = """
name: "ens" platform: "ensemble" max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "simple" model_version: -1
  input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } } ] }
"""


def write_repository(root: Path) -> Path:
    (root / "simple" / "1").mkdir(parents=True)
    (root / "simple" / "config.pbtxt").write_text(MODEL)
    (root / "simple" / "1" / "model.onnx").write_bytes(b"not loaded by the index")
    (root / "ens" / "1").mkdir(parents=True)
    (root / "ens" / "config.pbtxt").write_text(ENSEMBLE)
    return root


def test_ensemble_state_follows_its_composing_model(redis_url: str, tmp_path: Path) -> None:
    root = write_repository(tmp_path / "models")

    async def scenario(redis) -> None:
        registry = ModelRegistry(redis, open_store(str(root)))
        other = ModelRegistry(redis, open_store(str(root)))  # a second gateway
        await registry.start("poll", [])
        assert (await registry.get("ens")).ready
        shutil.move(root / "simple", tmp_path / "aside")
        assert await registry.poll()
        gone = await registry.get("ens")
        assert (gone.state, gone.reason) == (
            "UNAVAILABLE",
            "ensemble 'ens' contains models that are not in the repository: simple",
        )
        await other.sync()
        assert (await other.get("ens")).reason == gone.reason  # every gateway derives the same
        shutil.move(tmp_path / "aside", root / "simple")
        assert await registry.poll()
        assert (await registry.get("ens")).ready

    run(redis_url, scenario)


def test_explicit_mode_loads_composing_models_with_the_ensemble(redis_url: str, tmp_path: Path) -> None:
    root = write_repository(tmp_path / "models")

    async def scenario(redis) -> None:
        registry = ModelRegistry(redis, open_store(str(root)))
        await registry.start("explicit", ["ens"])
        assert (await registry.get("simple")).ready and (await registry.get("ens")).ready
        await registry.unload("simple")
        unloaded = await registry.get("ens")
        assert unloaded.reason == "ensemble 'ens' depends on 'simple' which is not ready: unloaded"
        loaded = await registry.load("ens")
        assert loaded.ready and (await registry.get("simple")).ready
        (root / "simple" / "1" / "model.onnx").unlink()
        await registry.unload("simple")
        refused = await registry.load("ens")
        assert not refused.ready
        assert refused.reason == (
            "ensemble 'ens' depends on 'simple' which is not ready: version 1 has no 'model.onnx'"
        )

    run(redis_url, scenario)


def test_an_explicit_load_checks_the_composing_models_it_loads(redis_url: str, tmp_path: Path) -> None:
    """With the load check on (what ``naiad serve`` runs: :class:`LoadProbe`), loading the
    ensemble loads ``simple`` in a child process; its file is no ONNX model, so ``simple`` is
    published UNAVAILABLE with the load error and the ensemble is not ready because of it."""
    root = write_repository(tmp_path / "models")

    async def scenario(redis) -> None:
        probe = LoadProbe(str(root), tmp_path / "cache", 1 << 30)
        registry = ModelRegistry(redis, open_store(str(root)), load_check=probe)
        await registry.start("explicit", [])
        refused = await registry.load("ens")
        simple = await registry.get("simple")
        assert simple.state == "UNAVAILABLE"
        assert simple.reason.startswith("unable to load model 'simple' version 1 (onnxruntime): ")
        assert refused.reason == f"ensemble 'ens' depends on 'simple' which is not ready: {simple.reason}"

    run(redis_url, scenario)
