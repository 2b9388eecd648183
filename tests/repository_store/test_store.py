"""Both stores, on the same repository tree (the ``store`` fixture is local and S3)."""

from __future__ import annotations

import pathlib

import pytest
from rs_helpers import ALL_MODELS

from naiad.errors import ModelNotFound, RepositoryError
from repository_store import LocalStore, RepositoryStore, validate_model_name


def test_check_passes(store: RepositoryStore) -> None:
    store.check()


def test_list_models_skips_files_and_invalid_names(store: RepositoryStore) -> None:
    assert store.list_models() == ALL_MODELS


def test_list_versions_numeric_only(store: RepositoryStore) -> None:
    assert store.list_versions("simple") == [1, 2, 3]
    assert store.list_versions("noconfig") == [1]
    assert store.list_versions("ens") == [1]
    assert store.list_versions("absent") == []


def test_read_config(store: RepositoryStore) -> None:
    text = store.read_config("simple")
    assert text is not None and b'platform: "onnxruntime_onnx"' in text
    assert store.read_config("noconfig") is None
    assert store.read_config("absent") is None


def test_list_version_files_recursive_and_sorted(store: RepositoryStore) -> None:
    files = store.list_version_files("simple", 3)
    assert [(f.path, f.size) for f in files] == [("extra/data.bin", 10), ("model.onnx", 8)]
    assert all(f.etag and '"' not in f.etag for f in files)
    assert store.list_version_files("simple", 9) == []
    assert store.list_version_files("ens", 1) == []


def test_fetch_file(store: RepositoryStore, tmp_path: pathlib.Path) -> None:
    dest = tmp_path / "out" / "deep" / "data.bin"
    store.fetch_file("simple", 3, "extra/data.bin", dest)
    assert dest.read_bytes() == b"\x00" * 10


def test_fetch_missing_file_is_repository_error(store: RepositoryStore, tmp_path) -> None:
    with pytest.raises(RepositoryError):
        store.fetch_file("simple", 3, "nope.onnx", tmp_path / "x")


def test_model_exists(store: RepositoryStore) -> None:
    assert store.model_exists("simple")
    assert store.model_exists("noconfig")
    assert not store.model_exists("absent")
    assert not store.model_exists("simp")  # a prefix of a real name is not a model


BAD_NAMES = [
    "",
    ".",
    "..",
    "../simple",
    "simple/..",
    "a/b",
    "a\\b",
    "..\\x",
    ".hidden",
    "{tagged}",
    "x{y",
    "a\x00b",
    "tab\tname",
    "x" * 256,
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_validate_model_name_rejects(name: str) -> None:
    with pytest.raises(ModelNotFound):
        validate_model_name(name)


@pytest.mark.parametrize("name", ["simple", "my-model_2", "résumé", "a.b", "x" * 255])
def test_validate_model_name_accepts(name: str) -> None:
    assert validate_model_name(name) == name


@pytest.mark.parametrize("name", ["../repo/simple", "..", "simple/../simple", ".hidden"])
def test_store_methods_reject_traversal(store: RepositoryStore, name: str, tmp_path) -> None:
    calls = [
        lambda: store.list_versions(name),
        lambda: store.read_config(name),
        lambda: store.list_version_files(name, 1),
        lambda: store.fetch_file(name, 1, "model.onnx", tmp_path / "x"),
        lambda: store.model_exists(name),
    ]
    for call in calls:
        with pytest.raises(ModelNotFound):
            call()


@pytest.mark.parametrize(
    "path",
    ["../config.pbtxt", "../../simple/config.pbtxt", "/etc/passwd", "a//b", "./model.onnx", ""],
)
def test_fetch_rejects_escaping_paths(store: RepositoryStore, path: str, tmp_path) -> None:
    with pytest.raises(RepositoryError, match="invalid file path"):
        store.fetch_file("simple", 3, path, tmp_path / "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("version", [0, -1, True])
def test_invalid_versions_rejected(store: RepositoryStore, version: int) -> None:
    with pytest.raises(ModelNotFound):
        store.list_version_files("simple", version)


def test_local_sibling_folder_is_not_reachable(tmp_path: pathlib.Path) -> None:
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "config.pbtxt").write_text("secret")
    (tmp_path / "repo").mkdir()
    store = LocalStore(tmp_path / "repo")
    with pytest.raises(ModelNotFound):
        store.read_config("../secret")


def test_local_missing_root(tmp_path: pathlib.Path) -> None:
    store = LocalStore(tmp_path / "nowhere")
    with pytest.raises(RepositoryError, match="not a readable folder"):
        store.check()
    with pytest.raises(RepositoryError, match="failed"):
        store.list_models()


def test_local_root_is_a_file(tmp_path: pathlib.Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(RepositoryError):
        LocalStore(tmp_path / "file").check()


def test_local_etag_changes_with_content(tmp_path: pathlib.Path) -> None:
    model = tmp_path / "m" / "1"
    model.mkdir(parents=True)
    (model / "model.onnx").write_bytes(b"aaaa")
    store = LocalStore(tmp_path)
    before = store.list_version_files("m", 1)[0]
    (model / "model.onnx").write_bytes(b"bbbbb")
    after = store.list_version_files("m", 1)[0]
    assert (before.size, after.size) == (4, 5)
    assert before.etag != after.etag


def test_local_dangling_symlink_is_skipped(tmp_path: pathlib.Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"x")
    (tmp_path / "m" / "1" / "gone.bin").symlink_to(tmp_path / "nowhere")
    assert [f.path for f in LocalStore(tmp_path).list_version_files("m", 1)] == ["model.onnx"]
