"""Broken or hostile contents of a model repository: each such model is UNAVAILABLE with a
clear reason, every other model is indexed as before, and nothing is read from or written to
outside the repository root or the cache folder."""

from __future__ import annotations

import os
import pathlib
import time

import boto3
import pytest
from rs_helpers import onnx_config, write_tree

from naiad.errors import ConfigError, RepositoryError
from naiad.registry import READY, UNAVAILABLE
from repository_store import LocalStore, S3Store
from repository_store.cache import ModelCache
from repository_store.index import MAX_CONFIG_BYTES, index_repository
from repository_store.store import UnsafeModelFile

GOOD = {"good/config.pbtxt": onnx_config("good"), "good/1/model.onnx": b"ok"}


def model(name: str, config: str | bytes, files: dict[str, bytes] | None = None) -> dict:
    files = files if files is not None else {"1/model.onnx": b"m"}
    return {f"{name}/config.pbtxt": config, **{f"{name}/{rel}": data for rel, data in files.items()}}


HOSTILE_CONFIGS = {
    # 10 MB: a comment line repeated, valid text format but far over any real config.
    "huge": (("# " + "x" * 1022 + "\n") * 10 * 1024, "over the"),
    "deep": ("parameters { key: \"k\" value { " * 20000 + "} }" * 20000, "does not parse"),
    "garbage": (b"\xa0" + os.urandom(4096), "not UTF-8"),
    "impostor": (onnx_config("good"), "good"),  # names another model
    "vast_dims": (onnx_config("vast_dims").replace("dims: [ 4 ]", f"dims: [ {2**62} ]"), None),
    "neg_dims": (onnx_config("neg_dims").replace("dims: [ 4 ]", "dims: [ -7 ]"), "dims"),
    "overflow_dims": (onnx_config("overflow_dims").replace("dims: [ 4 ]", f"dims: [ {2**64} ]"), "parse"),
}


@pytest.fixture
def hostile(tmp_path: pathlib.Path) -> pathlib.Path:
    files = dict(GOOD)
    for name, (config, _) in HOSTILE_CONFIGS.items():
        files |= model(name, config)
    files |= model("garbage_model", onnx_config("garbage_model"), {"1/model.onnx": os.urandom(2048)})
    root = write_tree(tmp_path / "repo", files)
    secret = write_tree(tmp_path / "outside", {"secret.txt": "top secret", "1/model.onnx": b"x"})
    # A model file, a version folder, a whole model folder and a label file pointing out.
    write_tree(root, model("link_file", onnx_config("link_file"), {}))
    (root / "link_file" / "1").mkdir()
    (root / "link_file" / "1" / "model.onnx").symlink_to(secret / "secret.txt")
    write_tree(root, model("link_version", onnx_config("link_version"), {}))
    (root / "link_version" / "1").symlink_to(secret / "1")
    (root / "link_model").symlink_to(secret)
    write_tree(root, model("link_config", "", {"1/model.onnx": b"m"}))
    (root / "link_config" / "config.pbtxt").unlink()
    (root / "link_config" / "config.pbtxt").symlink_to(secret / "secret.txt")
    # A symlink loop and a symlink that stays inside the root are fine.
    write_tree(root, model("loop", onnx_config("loop")))
    (root / "loop" / "1" / "again").symlink_to(root / "loop" / "1")
    write_tree(root, model("inner_link", onnx_config("inner_link"), {}))
    (root / "inner_link" / "1").mkdir()
    (root / "inner_link" / "1" / "model.onnx").symlink_to(root / "good" / "1" / "model.onnx")
    return root


def test_each_hostile_model_is_unavailable_and_the_others_serve(hostile):
    start = time.monotonic()
    entries = index_repository(LocalStore(hostile))
    assert time.monotonic() - start < 20, "indexing hostile configs must stay bounded"
    assert entries["good"].state == READY
    assert entries["inner_link"].state == READY and entries["loop"].state == READY
    for name, (_, reason) in HOSTILE_CONFIGS.items():
        if reason is None:
            continue
        assert entries[name].state == UNAVAILABLE, name
        assert reason in entries[name].reason and entries[name].reason, (name, entries[name].reason)
    assert str(MAX_CONFIG_BYTES) in entries["huge"].reason
    for name in ("link_file", "link_version", "link_model", "link_config"):
        assert entries[name].state == UNAVAILABLE, name
        assert "outside the model repository" in entries[name].reason, entries[name].reason
    # A garbage model file is the worker's problem (it fails to load); the index only checks
    # that the file is there. dims of 2**62 are valid int64s, as in Triton.
    assert entries["garbage_model"].state == READY and entries["vast_dims"].state == READY


def test_the_local_store_never_reads_out_of_its_root(hostile, tmp_path):
    store = LocalStore(hostile)
    with pytest.raises(UnsafeModelFile):
        store.read_config("link_config")
    with pytest.raises(UnsafeModelFile):
        store.fetch_file("link_file", 1, "model.onnx", tmp_path / "copy")
    assert not (tmp_path / "copy").exists()
    with pytest.raises(UnsafeModelFile):
        store.list_version_files("link_version", 1)
    with pytest.raises(UnsafeModelFile):
        store.list_versions("link_model")
    assert "unsafe" not in store.fingerprints()["good"]


def test_the_cache_refuses_an_escaping_model_and_writes_only_inside(hostile, tmp_path):
    cache = ModelCache(tmp_path / "cache")
    before = set(tmp_path.rglob("*"))
    with pytest.raises(ConfigError, match="outside"):
        cache.ensure_version(LocalStore(hostile), "link_file", 1)
    created = set(tmp_path.rglob("*")) - before
    assert all(path.is_relative_to(tmp_path / "cache") for path in created), created
    folder = cache.ensure_version(LocalStore(hostile), "inner_link", 1)
    assert (folder / "model.onnx").read_bytes() == b"ok"


def test_s3_keys_with_dot_dot_never_leave_the_cache(s3_endpoint, s3_bucket, tmp_path):
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    put = lambda key, body: client.put_object(Bucket=s3_bucket, Key=f"models/{key}", Body=body)  # noqa: E731
    for key, body in {**GOOD, **model("dotdot", onnx_config("dotdot"))}.items():
        put(key, body)
    put("dotdot/1/../../../../escaped.txt", b"payload")  # S3 keys are plain strings
    put("dotdot/1//empty-part", b"payload")
    put("updir/config.pbtxt", onnx_config("updir"))
    put("updir/../1/model.onnx", b"m")  # a version folder named '..'
    store = S3Store(s3_bucket, "models", s3_endpoint)
    entries = index_repository(store)
    assert entries["good"].state == READY
    assert entries["dotdot"].state == UNAVAILABLE and "unsafe object key" in entries["dotdot"].reason
    assert entries["updir"].state == UNAVAILABLE and "no version" in entries["updir"].reason
    cache = ModelCache(tmp_path / "cache")
    with pytest.raises(ConfigError, match="unsafe object key"):
        cache.ensure_version(store, "dotdot", 1)
    assert not list(tmp_path.rglob("escaped.txt"))
    with pytest.raises(RepositoryError):
        store.fetch_file("dotdot", 1, "../../../../escaped.txt", tmp_path / "cache" / ".tmp" / "x" / "y")
    assert not list(tmp_path.rglob("escaped.txt"))
    assert cache.ensure_version(store, "good", 1).joinpath("model.onnx").read_bytes() == b"ok"


def test_a_server_on_a_hostile_repository_serves_the_good_models(hostile, example_repository, tmp_path):
    """End to end: the hostile models beside the real ``digits``; every answer is a clear
    4xx, the server stays ready and ``digits`` answers."""
    import shutil

    import numpy as np
    import requests
    from naiad_harness import run_server

    shutil.copytree(example_repository / "digits", hostile / "digits")
    with run_server(hostile, tmp_path / "server", request_timeout_s=20) as server:
        index = {m["name"]: m for m in requests.post(f"{server.http}/v2/repository/index", timeout=10).json()}
        assert index["digits"]["state"] == READY and index["link_model"]["state"] == UNAVAILABLE
        assert "outside the model repository" in index["link_file"]["reason"]
        for name in ("huge", "impostor", "link_file", "link_model"):
            response = requests.get(f"{server.http}/v2/models/{name}/ready", timeout=10)
            assert response.status_code == 400 and "error" in response.json()
            response = requests.post(f"{server.http}/v2/models/{name}/infer", json={"inputs": []}, timeout=10)
            assert 400 <= response.status_code < 500 and "error" in response.json(), (name, response.text)
        vast = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2**62], "data": [1.0]}]}
        response = requests.post(f"{server.http}/v2/models/vast_dims/infer", json=vast, timeout=10)
        assert response.status_code == 400, response.text
        digits = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]}
        response = requests.post(f"{server.http}/v2/models/digits/infer", json=digits, timeout=60)
        assert response.status_code == 200, response.text
        assert np.asarray(response.json()["outputs"][0]["data"]).size == 10
        assert requests.get(f"{server.http}/v2/health/ready", timeout=10).status_code == 200
        assert "unhandled error" not in server.log()
