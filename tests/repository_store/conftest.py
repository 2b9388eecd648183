"""A small Triton-layout repository, written to tmp_path and, for S3, uploaded to moto."""

from __future__ import annotations

import pathlib
import sys

# ``tests/`` is on sys.path (pytest's default "prepend" import mode) and holds a folder named
# ``repository_store``, which Python would import as a namespace package ahead of the
# editable install's finder. Putting the project root first lets the real package win under
# plain ``pytest`` too (``python -m pytest`` already has it). A ``pythonpath = ["."]`` in the
# pytest config would make this unnecessary.
_ROOT = str(pathlib.Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import pytest  # noqa: E402
from rs_helpers import REPOSITORY, upload_tree, write_tree  # noqa: E402

from repository_store import LocalStore, RepositoryStore, S3Store  # noqa: E402


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
