"""Fixtures of the conformance suite: the repository, the one server, the clients.

See :mod:`conformance_client` for the models and the four-client adapter.
"""

from __future__ import annotations

import pathlib
import shutil
from collections.abc import Iterator

import grpc
import pytest
from conformance_client import (
    CLIENTS,
    RESHAPE_SCALAR_CONFIG,
    SPARE_CONFIG,
    VERSIONED_CONFIG,
    Client,
    add_model,
    write_model,
)
from naiad_harness import NaiadServer, start_server
from onnx import TensorProto
from tritonclient.grpc import service_pb2_grpc


@pytest.fixture(scope="session")
def conformance_repository(tmp_path_factory, example_repository: pathlib.Path) -> pathlib.Path:
    root = tmp_path_factory.mktemp("conformance") / "models"
    shutil.copytree(example_repository, root)  # built by examples/build_repository.py
    write_model(root, "reshape_scalar", RESHAPE_SCALAR_CONFIG, {1: add_model(TensorProto.INT64, ["b"], 1)})
    write_model(
        root,
        "versioned",
        VERSIONED_CONFIG,
        {v: add_model(TensorProto.FLOAT, ["r", "c"], float(v)) for v in (1, 2)},
    )
    write_model(root, "spare", SPARE_CONFIG, {1: add_model(TensorProto.FLOAT, ["b", 2], 0.0)})
    return root


@pytest.fixture(scope="package")
def server(conformance_repository, tmp_path_factory) -> Iterator[NaiadServer]:
    running = start_server(
        conformance_repository,
        tmp_path_factory.mktemp("conformance-server"),
        idle_timeout_s=300,
        extra_args=["--model-control-mode", "explicit", "--load-model", "*"],
    )
    try:
        yield running
    finally:
        running.stop()
    # Every bad request of the suite was answered as such: none reached the catch-all.
    assert "unhandled error" not in running.log(), running.log()[-3000:]


@pytest.fixture
def stub(server) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    finally:
        channel.close()


@pytest.fixture(params=list(CLIENTS))
def client(request, server) -> Client:
    return Client(request.param, server)


@pytest.fixture(params=["http", "http_aio"])
def http_client(request, server) -> Client:
    return Client(request.param, server)
