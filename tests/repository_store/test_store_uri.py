from __future__ import annotations

import os

import pytest

from naiad.errors import RepositoryError
from repository_store import LocalStore, RepositoryURI, S3Store, open_store, parse_repository_uri


def test_plain_absolute_path() -> None:
    assert parse_repository_uri("/srv/models") == RepositoryURI(kind="local", path="/srv/models")


def test_relative_path_becomes_absolute() -> None:
    uri = parse_repository_uri("models/here")
    assert uri.kind == "local"
    assert uri.path == os.path.join(os.getcwd(), "models", "here")


def test_file_uri() -> None:
    assert parse_repository_uri("file:///srv/my%20models").path == "/srv/my models"


def test_s3_bucket_only() -> None:
    assert parse_repository_uri("s3://models") == RepositoryURI(kind="s3", bucket="models")


def test_s3_bucket_and_prefix_trimmed() -> None:
    uri = parse_repository_uri("s3://models/team/prod/")
    assert (uri.bucket, uri.prefix, uri.endpoint_url) == ("models", "team/prod", None)


def test_s3_triton_host_port_form() -> None:
    uri = parse_repository_uri("s3://127.0.0.1:9000/models/team")
    assert uri == RepositoryURI(
        kind="s3", bucket="models", prefix="team", endpoint_url="http://127.0.0.1:9000"
    )


def test_s3_hostname_port_form() -> None:
    uri = parse_repository_uri("s3://minio.local:9000/models")
    assert (uri.endpoint_url, uri.bucket, uri.prefix) == ("http://minio.local:9000", "models", "")


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "   ",
        "s3://",
        "s3:///",
        "s3://host:9000/",
        "s3://host:notaport/models",
        "s3://host:99999/models",
        "s3://:9000/models",
        "s3://a/prefix",
        "s3://Bad Bucket/x",
        "s3://models/../escape",
        "gs://models/x",
        "http://example.com/models",
        "file://remotehost/srv",
    ],
)
def test_bad_uris_raise_repository_error(bad: str) -> None:
    with pytest.raises(RepositoryError):
        parse_repository_uri(bad)


def test_open_store_picks_the_kind(tmp_path, s3_endpoint) -> None:
    local = open_store(str(tmp_path))
    assert isinstance(local, LocalStore) and local.uri == str(tmp_path)
    port = s3_endpoint.rsplit(":", 1)[1]
    remote = open_store(f"s3://127.0.0.1:{port}/bucket-x/pre/fix")
    assert isinstance(remote, S3Store)
    assert (remote.bucket, remote.prefix, remote.uri) == (
        "bucket-x",
        "pre/fix",
        "s3://bucket-x/pre/fix",
    )
    assert remote.client.meta.endpoint_url == s3_endpoint
