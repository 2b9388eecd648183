"""Fixtures of the differential suite: one repository, real Triton and ``naiad serve`` on it."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import grpc
import pytest
from naiad_harness import NaiadServer, start_server
from tritonclient.grpc import service_pb2_grpc

from tests.differential.repository import build_repository
from tests.differential.triton_server import TritonServer, start_triton


@pytest.fixture(scope="package")
def repository(tmp_path_factory) -> pathlib.Path:
    return build_repository(tmp_path_factory.mktemp("differential") / "models")


@pytest.fixture(scope="package")
def triton(repository, tmp_path_factory) -> Iterator[TritonServer]:
    server = start_triton(repository, tmp_path_factory.mktemp("triton"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def naiad(repository, tmp_path_factory) -> Iterator[NaiadServer]:
    server = start_server(repository, tmp_path_factory.mktemp("naiad"), idle_timeout_s=600)
    try:
        yield server
    finally:
        server.stop()
    assert "unhandled error" not in server.log(), server.log()[-3000:]


@pytest.fixture(scope="package")
def servers(triton, naiad) -> tuple[TritonServer, NaiadServer]:
    return triton, naiad


@pytest.fixture(scope="package")
def stubs(servers) -> Iterator[tuple[service_pb2_grpc.GRPCInferenceServiceStub, ...]]:
    channels = [grpc.insecure_channel(server.grpc_url) for server in servers]
    try:
        yield tuple(service_pb2_grpc.GRPCInferenceServiceStub(channel) for channel in channels)
    finally:
        for channel in channels:
            channel.close()
