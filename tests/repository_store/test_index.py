from __future__ import annotations

import pathlib

import pytest
from rs_helpers import ALL_MODELS, GOOD_MODELS, onnx_config, write_tree

from naiad.errors import ModelNotFound, RepositoryError
from naiad.registry import READY, UNAVAILABLE, ModelEntry
from repository_store import (
    LocalStore,
    RepositoryStore,
    S3Store,
    index_model,
    index_repository,
)


def test_broken_models_do_not_take_others_down(store: RepositoryStore) -> None:
    index = index_repository(store)
    assert sorted(index) == ALL_MODELS
    ready = sorted(name for name, entry in index.items() if entry.state == READY)
    assert ready == GOOD_MODELS
    assert index["simple"].versions == [3]
    assert index["noname"].versions == [1, 2]
    assert index["noname"].config.name == "noname"
    assert index["ens"].versions == [1]
    assert index["tf"].versions == [1]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("noconfig", "missing config.pbtxt"),
        ("broken", "does not parse"),
        ("nofile", "version 1 has no 'model.onnx'"),
        ("noversion", "no version available under the version policy"),
    ],
)
def test_unavailable_reasons(store: RepositoryStore, name: str, reason: str) -> None:
    entry = index_model(store, name)
    assert entry.state == UNAVAILABLE
    assert reason in entry.reason
    assert not entry.ready


def test_invalid_config_is_unavailable(tmp_path: pathlib.Path) -> None:
    text = onnx_config("m").replace("dims: [ 4 ]", "dims: [ 0 ]")
    write_tree(tmp_path, {"m/config.pbtxt": text, "m/1/model.onnx": b"x"})
    entry = index_model(LocalStore(tmp_path), "m")
    assert (entry.state, entry.config) == (UNAVAILABLE, None)
    assert ">= 1" in entry.reason


def test_every_selected_version_needs_its_file(tmp_path: pathlib.Path) -> None:
    """A version without its model file fails alone; the others serve (Triton loads each
    version on its own). With none left the model is UNAVAILABLE."""
    write_tree(
        tmp_path,
        {
            "m/config.pbtxt": onnx_config("m", "version_policy { all { } }"),
            "m/1/model.onnx": b"x",
            "m/2/other.onnx": b"x",
        },
    )
    entry = index_model(LocalStore(tmp_path), "m")
    assert (entry.state, entry.versions, entry.reason) == (READY, [1], "")
    assert entry.failed == {2: "version 2 has no 'model.onnx'"}
    assert entry.problem == "version 2 has no 'model.onnx'"
    assert ModelEntry.from_bytes(entry.to_bytes()) == entry
    (tmp_path / "m" / "1" / "model.onnx").unlink()
    entry = index_model(LocalStore(tmp_path), "m")
    assert (entry.state, entry.versions, entry.reason) == (UNAVAILABLE, [], "version 2 has no 'model.onnx'")
    assert sorted(entry.failed) == [1, 2]


def test_default_model_filename_is_honoured(tmp_path: pathlib.Path) -> None:
    config = onnx_config("m", 'default_model_filename: "net.onnx"')
    write_tree(tmp_path, {"m/config.pbtxt": config, "m/1/net.onnx": b"x"})
    assert index_model(LocalStore(tmp_path), "m").state == READY


def test_index_model_unknown_and_invalid_names(store: RepositoryStore) -> None:
    with pytest.raises(ModelNotFound):
        index_model(store, "absent")
    with pytest.raises(ModelNotFound):
        index_model(store, "../simple")


def test_entry_roundtrip(store: RepositoryStore) -> None:
    for entry in index_repository(store).values():
        again = ModelEntry.from_bytes(entry.to_bytes())
        assert again == entry


def test_entry_from_bad_bytes() -> None:
    with pytest.raises(ValueError, match="malformed"):
        ModelEntry.from_bytes(b"\x93\x01\x02\x03")


def test_unreachable_store_raises(tmp_path: pathlib.Path) -> None:
    with pytest.raises(RepositoryError):
        index_repository(LocalStore(tmp_path / "gone"))


def test_missing_bucket_raises(s3_endpoint: str) -> None:
    with pytest.raises(RepositoryError, match="does not exist"):
        index_repository(S3Store("no-such-bucket-here", "", s3_endpoint))
