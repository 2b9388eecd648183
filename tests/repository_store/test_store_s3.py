"""S3-specific behaviour, against moto's S3 server over HTTP."""

from __future__ import annotations

import pathlib
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
from naiad_harness import free_port
from rs_helpers import ALL_MODELS, upload_tree

from naiad.errors import RepositoryError
from repository_store import S3Store, index_repository, open_store


def test_triton_host_port_uri(s3_endpoint: str, s3_bucket: str, local_repo) -> None:
    upload_tree(s3_endpoint, s3_bucket, "a/b", local_repo)
    port = s3_endpoint.rsplit(":", 1)[1]
    store = open_store(f"s3://127.0.0.1:{port}/{s3_bucket}/a/b")
    store.check()
    assert store.list_models() == ALL_MODELS


def test_aws_endpoint_url_env_is_honoured(s3_endpoint: str, s3_bucket: str, local_repo, monkeypatch) -> None:
    upload_tree(s3_endpoint, s3_bucket, "", local_repo)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    store = open_store(f"s3://{s3_bucket}")
    assert store.list_models() == ALL_MODELS
    assert index_repository(store)["simple"].versions == [3]


def test_missing_bucket(s3_endpoint: str) -> None:
    store = S3Store("absent-bucket-1", "x", s3_endpoint)
    with pytest.raises(RepositoryError, match="does not exist"):
        store.check()
    with pytest.raises(RepositoryError, match="does not exist"):
        store.list_models()
    with pytest.raises(RepositoryError, match="does not exist"):
        store.read_config("m")


def test_unreachable_endpoint() -> None:
    store = S3Store("models", "", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(RepositoryError, match="failed") as info:
        store.check()
    assert "Traceback" not in str(info.value)
    with pytest.raises(RepositoryError):
        store.list_models()


def test_folder_markers_are_not_files(s3_endpoint: str, s3_bucket: str) -> None:
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.put_object(Bucket=s3_bucket, Key="m/1/", Body=b"")
    client.put_object(Bucket=s3_bucket, Key="m/1/model.onnx", Body=b"abc")
    store = S3Store(s3_bucket, "", s3_endpoint)
    files = store.list_version_files("m", 1)
    assert [(f.path, f.size) for f in files] == [("model.onnx", 3)]
    assert files[0].etag == "900150983cd24fb0d6963f7d28e17f72"  # md5("abc")


def test_listing_paginates_past_1000(s3_endpoint: str, s3_bucket: str, tmp_path: pathlib.Path) -> None:
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    names = [f"model-{i:04d}" for i in range(1005)]

    def put(name: str) -> None:
        client.put_object(Bucket=s3_bucket, Key=f"p/{name}/1/model.onnx", Body=b"x")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, names))
    client.put_object(Bucket=s3_bucket, Key="p/model-0000/config.pbtxt", Body=b"")
    store = S3Store(s3_bucket, "p", s3_endpoint)
    assert store.list_models() == names
    assert store.read_config("model-0000") == b""
    assert store.read_config("model-0001") is None
