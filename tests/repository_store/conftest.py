"""A small Triton-layout repository, written to tmp_path and, for S3, uploaded to moto."""

from __future__ import annotations

import pathlib

import pytest
from rs_helpers import REPOSITORY, upload_tree, write_tree

from repository_store import LocalStore, RepositoryStore, S3Store


@pytest.fixture
def local_repo(tmp_path: pathlib.Path) -> pathlib.Path:
    return write_tree(tmp_path / "repo", REPOSITORY)


@pytest.fixture(params=["local", "s3"])
def store(request, local_repo: pathlib.Path) -> RepositoryStore:
    """The same repository as a LocalStore and as an S3Store (under a prefix) on moto."""
    if request.param == "local":
        return LocalStore(local_repo)
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    upload_tree(endpoint, bucket, "team/models", local_repo)
    return S3Store(bucket, "team/models", endpoint)
