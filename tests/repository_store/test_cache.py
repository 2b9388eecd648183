"""The download cache, with real stores: files in tmp_path and moto S3."""

from __future__ import annotations

import multiprocessing
import os
import pathlib

import boto3
import pytest
from rs_helpers import upload_tree, write_tree

from naiad.errors import ModelNotFound, RepositoryError
from repository_store import FileInfo, LocalStore, ModelCache, S3Store, verify_file


def make_store(root: pathlib.Path, versions: dict[int, bytes]) -> LocalStore:
    files = {f"m/{v}/model.onnx": content for v, content in versions.items()}
    files["m/1/sub/vocab.txt"] = b"hello"
    return LocalStore(write_tree(root, files))


def test_first_ensure_downloads_second_does_not(tmp_path: pathlib.Path) -> None:
    store = make_store(tmp_path / "repo", {1: b"abc" * 100})
    cache = ModelCache(tmp_path / "cache")
    folder = cache.ensure_version(store, "m", 1)
    assert (folder / "model.onnx").read_bytes() == b"abc" * 100
    assert (folder / "sub" / "vocab.txt").read_bytes() == b"hello"
    assert cache.last_pull.downloaded and cache.last_pull.bytes == 305
    assert cache.last_pull.seconds >= 0
    again = cache.ensure_version(store, "m", 1)
    assert again == folder
    assert cache.last_pull.downloaded is False and cache.last_pull.bytes == 0
    # A second cache object on the same folder (another process) reuses the download too.
    other = ModelCache(tmp_path / "cache")
    assert other.ensure_version(store, "m", 1) == folder
    assert other.last_pull.downloaded is False


def test_version_folder_holds_only_the_model_files(tmp_path: pathlib.Path) -> None:
    store = make_store(tmp_path / "repo", {1: b"x"})
    folder = ModelCache(tmp_path / "cache").ensure_version(store, "m", 1)
    found = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert found == ["model.onnx", "sub/vocab.txt"]
    assert not list((tmp_path / "cache" / ".tmp").iterdir())


def test_changed_etag_downloads_again(tmp_path: pathlib.Path) -> None:
    store = make_store(tmp_path / "repo", {1: b"old!"})
    cache = ModelCache(tmp_path / "cache")
    folder = cache.ensure_version(store, "m", 1)
    (tmp_path / "repo" / "m" / "1" / "model.onnx").write_bytes(b"new!")  # same size
    os.utime(tmp_path / "repo" / "m" / "1" / "model.onnx", ns=(1, 1))
    assert cache.ensure_version(store, "m", 1) == folder
    assert cache.last_pull.downloaded
    assert (folder / "model.onnx").read_bytes() == b"new!"


def test_removed_file_disappears_from_the_cache(tmp_path: pathlib.Path) -> None:
    store = make_store(tmp_path / "repo", {1: b"x"})
    cache = ModelCache(tmp_path / "cache")
    folder = cache.ensure_version(store, "m", 1)
    (tmp_path / "repo" / "m" / "1" / "sub" / "vocab.txt").unlink()
    cache.ensure_version(store, "m", 1)
    assert cache.last_pull.downloaded
    assert not (folder / "sub" / "vocab.txt").exists()


def test_s3_download_checks_md5_and_redownloads_on_change(
    s3_endpoint: str, s3_bucket: str, tmp_path: pathlib.Path
) -> None:
    write_tree(tmp_path / "repo", {"m/2/model.onnx": b"first", "m/2/x/y.bin": b"yy"})
    upload_tree(s3_endpoint, s3_bucket, "pre", tmp_path / "repo")
    store = S3Store(s3_bucket, "pre", s3_endpoint)
    cache = ModelCache(tmp_path / "cache")
    folder = cache.ensure_version(store, "m", 2)
    assert (folder / "model.onnx").read_bytes() == b"first"
    assert (folder / "x" / "y.bin").read_bytes() == b"yy"
    cache.ensure_version(store, "m", 2)
    assert not cache.last_pull.downloaded
    boto3.client("s3", endpoint_url=s3_endpoint).put_object(
        Bucket=s3_bucket, Key="pre/m/2/model.onnx", Body=b"other"
    )
    cache.ensure_version(store, "m", 2)
    assert cache.last_pull.downloaded
    assert (folder / "model.onnx").read_bytes() == b"other"


def test_two_repositories_never_collide(tmp_path: pathlib.Path) -> None:
    first = make_store(tmp_path / "a", {1: b"from a"})
    second = make_store(tmp_path / "b", {1: b"from b"})
    cache = ModelCache(tmp_path / "cache")
    folder_a = cache.ensure_version(first, "m", 1)
    folder_b = cache.ensure_version(second, "m", 1)
    assert folder_a != folder_b
    assert (folder_a / "model.onnx").read_bytes() == b"from a"
    assert (folder_b / "model.onnx").read_bytes() == b"from b"


def test_missing_version_and_bad_names(tmp_path: pathlib.Path) -> None:
    store = make_store(tmp_path / "repo", {1: b"x"})
    cache = ModelCache(tmp_path / "cache")
    with pytest.raises(ModelNotFound):
        cache.ensure_version(store, "m", 7)
    with pytest.raises(ModelNotFound):
        cache.ensure_version(store, "../m", 1)


def test_eviction_under_a_tiny_cap(tmp_path: pathlib.Path) -> None:
    store = make_store(tmp_path / "repo", {1: b"1" * 995, 2: b"2" * 1000, 3: b"3" * 1000})
    cache = ModelCache(tmp_path / "cache", max_bytes=2500)
    v1 = cache.ensure_version(store, "m", 1)
    v2 = cache.ensure_version(store, "m", 2)
    assert v1.is_dir() and v2.is_dir()
    cache.ensure_version(store, "m", 1)  # v1 is now the most recently used
    v3 = cache.ensure_version(store, "m", 3)
    assert v1.is_dir() and v3.is_dir()
    assert not v2.exists()  # the least recently used went
    cache.ensure_version(store, "m", 2)
    assert cache.last_pull.downloaded  # evicted, so pulled again


def test_the_returned_version_is_never_evicted(tmp_path: pathlib.Path) -> None:
    store = make_store(tmp_path / "repo", {1: b"1" * 100, 2: b"2" * 5000})
    cache = ModelCache(tmp_path / "cache", max_bytes=1000)
    v1 = cache.ensure_version(store, "m", 1)
    v2 = cache.ensure_version(store, "m", 2)
    assert (v2 / "model.onnx").stat().st_size == 5000
    assert not v1.exists()


def test_verify_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    verify_file(path, FileInfo("f", 3, "900150983cd24fb0d6963f7d28e17f72"))
    verify_file(path, FileInfo("f", 3, "123-3"))  # not an MD5: size only
    verify_file(path, FileInfo("f", 3, "0123456789abcdef0123456789abcdef-2"))  # multipart
    with pytest.raises(RepositoryError, match="expected 4"):
        verify_file(path, FileInfo("f", 4, "x"))
    with pytest.raises(RepositoryError, match="does not match its ETag"):
        verify_file(path, FileInfo("f", 3, "0" * 32))


def _ensure_in_child(cache_root: str, repo_root: str, barrier, results) -> None:
    cache = ModelCache(pathlib.Path(cache_root))
    barrier.wait(30)
    folder = cache.ensure_version(LocalStore(repo_root), "m", 1)
    results.put((str(folder), cache.last_pull.downloaded, (folder / "model.onnx").stat().st_size))


def test_concurrent_processes_download_once(tmp_path: pathlib.Path) -> None:
    size = 32 << 20
    make_store(tmp_path / "repo", {1: os.urandom(1024) * (size // 1024)})
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    args = (str(tmp_path / "cache"), str(tmp_path / "repo"), barrier, results)
    children = [ctx.Process(target=_ensure_in_child, args=args) for _ in range(2)]
    for child in children:
        child.start()
    outcomes = [results.get(timeout=60) for _ in children]
    for child in children:
        child.join(30)
        assert child.exitcode == 0
    assert {folder for folder, _, _ in outcomes} == {outcomes[0][0]}
    assert sorted(downloaded for _, downloaded, _ in outcomes) == [False, True]
    assert all(got == size for _, _, got in outcomes)


def test_cached_copy_serves_when_the_store_is_gone(tmp_path: pathlib.Path) -> None:
    store = make_store(tmp_path / "repo", {1: b"x"})
    cache = ModelCache(tmp_path / "cache")
    folder = cache.ensure_version(store, "m", 1)
    (tmp_path / "repo").rename(tmp_path / "moved")
    assert cache.ensure_version(store, "m", 1) == folder
    assert not cache.last_pull.downloaded
    with pytest.raises(RepositoryError):
        ModelCache(tmp_path / "other-cache").ensure_version(store, "m", 1)
