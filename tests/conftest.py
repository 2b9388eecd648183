"""Shared fixtures: real servers on loopback, each started here and stopped when done.

- ``redis_url``: a private ``redis-server`` (the product's own :class:`EmbeddedRedis`).
- ``s3_endpoint``: moto's S3 server (``moto.server``) on a free loopback port, reached over
  HTTP with boto3 exactly as a real S3 endpoint would be.
- ``s3_bucket``: a fresh, empty bucket on that server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import boto3
import pytest
import requests

from naiad.redis_server import EmbeddedRedis

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout_s: float = 30.0) -> None:
    """Wait until ``url`` answers any HTTP status; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            requests.get(url, timeout=1)
            return
        except requests.ConnectionError:
            time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


@pytest.fixture
def redis_url() -> Iterator[str]:
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a moto S3 server; also sets boto3's credentials env."""
    os.environ.update(S3_ENV)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_http(endpoint)
        yield endpoint
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """Name of a new empty bucket on the moto server."""
    name = f"models-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name
