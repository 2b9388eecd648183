"""A model whose files the backend refuses (a corrupt ``model.onnx`` the index cannot tell
from a good one) on a real ``naiad serve``, driven by NVIDIA's tritonclient: the first
request gets the load error; then, as in Triton, the model is UNAVAILABLE with that error as
its reason (ready false, repository index, status page), requests are refused with it and no
worker is started for it, not even for its ``naiad.min_workers`` (no crash loop), until it
is loaded again (explicit mode) or its files change (poll mode)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from naiad_harness import NaiadServer, wait_for
from prom_text import parse
from tritonclient.utils import InferenceServerException

ENV = {"NAIAD_WARM_POOL_SIZE": "0"}
POLL_S = 1
LOAD_ERROR = "unable to load model 'bad' version 1 (onnxruntime)"
#: Scaler ticks (1 s each) watched for a worker start that must not come.
QUIET_S = 4.0


@pytest.fixture
def repository(tmp_path: Path, example_repository: Path) -> Path:
    """The example repository plus ``bad``: digits with a corrupt ``1/model.onnx``."""
    root = Path(shutil.copytree(example_repository, tmp_path / "models"))
    shutil.copytree(root / "digits", root / "bad")
    config = root / "bad" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "digits"', 'name: "bad"'))
    (root / "bad" / "1" / "model.onnx").write_bytes(b"\x00 not a model " * 8)
    return root


def fix(repository: Path) -> None:
    """``bad``'s model file replaced by the good one (written aside, renamed into place)."""
    staging = repository / "bad" / "1" / ".model.onnx"
    shutil.copyfile(repository / "digits" / "1" / "model.onnx", staging)
    staging.rename(repository / "bad" / "1" / "model.onnx")


def infer_http(server: NaiadServer, model: str = "bad") -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("input", [2, 64], "FP32")
        tensor.set_data_from_numpy(np.ones((2, 64), np.float32))
        return client.infer(model, [tensor]).as_numpy("label")
    finally:
        client.close()


def infer_grpc(server: NaiadServer, model: str = "bad") -> np.ndarray:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("input", [2, 64], "FP32")
        tensor.set_data_from_numpy(np.ones((2, 64), np.float32))
        return client.infer(model, [tensor], client_timeout=60).as_numpy("label")
    finally:
        client.close()


def failure(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def ready(server: NaiadServer, model: str = "bad") -> bool:
    client = httpclient.InferenceServerClient(server.url)
    try:
        return client.is_model_ready(model)
    finally:
        client.close()


def index_entry(server: NaiadServer, model: str = "bad") -> dict:
    client = httpclient.InferenceServerClient(server.url)
    try:
        return next(item for item in client.get_model_repository_index() if item["name"] == model)
    finally:
        client.close()


def starts(server: NaiadServer, model: str = "bad") -> float:
    """Workers the scaler started for ``model`` (``naiad_scaler_decisions_total``)."""
    return parse(server.metrics()).get("naiad_scaler_decisions_total", model=model, action="start")


def assert_unavailable_with_the_load_error(server: NaiadServer) -> None:
    assert not ready(server)
    entry = index_entry(server)
    assert entry["state"] == "UNAVAILABLE" and entry["reason"].startswith(LOAD_ERROR), entry
    assert entry["version"] == "1"
    page = requests.get(f"{server.http}/", timeout=10).text  # what `naiad status` shows too
    assert "unavailable" in page and "unable to load model" in page
    refused = failure(lambda: infer_grpc(server))  # at the gateway: Triton's not-ready error
    assert refused.status() == "StatusCode.UNAVAILABLE" and LOAD_ERROR in refused.message()


def test_a_failed_load_stays_unavailable_until_loaded_again(naiad_server, repository):
    config = repository / "bad" / "config.pbtxt"  # one worker kept up at all times, if it loaded
    minimum = 'parameters { key: "naiad.min_workers" value: { string_value: "1" } }\n'
    config.write_text(config.read_text() + minimum)
    server = naiad_server(repository, extra_env=ENV, extra_args=[
        "--model-control-mode", "explicit", "--load-model", "digits", "--load-model", "bad"])  # fmt: skip

    first = failure(lambda: infer_http(server))
    assert first.status() == "400" and LOAD_ERROR in first.message()
    assert_unavailable_with_the_load_error(server)
    wait_for(lambda: not server.worker_processes("bad"), 20, "the failed worker to exit")
    started = starts(server)
    assert started >= 1
    time.sleep(QUIET_S)
    assert starts(server) == started and not server.worker_processes("bad")  # no crash loop
    assert "marked UNAVAILABLE" in server.log()
    assert infer_http(server, "digits").shape == (2, 1)  # the others keep serving

    fix(repository)
    client = httpclient.InferenceServerClient(server.url)
    try:
        client.load_model("bad")
        assert client.is_model_ready("bad")
    finally:
        client.close()
    assert index_entry(server) == {"name": "bad", "version": "1", "state": "READY"}  # no reason: none
    np.testing.assert_array_equal(infer_http(server), infer_http(server, "digits"))
    wait_for(lambda: starts(server) > started, 10, "a worker for the loaded model")


def test_poll_mode_brings_it_back_when_its_files_change(naiad_server, repository):
    server = naiad_server(repository, extra_env=ENV, extra_args=[
        "--model-control-mode", "poll", "--repository-poll-secs", str(POLL_S)])  # fmt: skip

    first = failure(lambda: infer_grpc(server))
    assert first.status() == "StatusCode.UNAVAILABLE" and LOAD_ERROR in first.message()
    time.sleep(3 * POLL_S)  # polls that find nothing changed leave it unavailable
    assert_unavailable_with_the_load_error(server)

    fix(repository)
    wait_for(lambda: ready(server), 15, "the fixed model to be ready again")
    np.testing.assert_array_equal(infer_http(server), infer_http(server, "digits"))


def test_an_explicit_load_fails_at_once_with_the_load_error(naiad_server, repository):
    """Triton's load_model loads before it answers: a corrupt or truncated ``model.onnx``, or
    a Python model whose ``initialize`` raises, fails the load itself (HTTP 400, gRPC error)
    with the load error, and the model is UNAVAILABLE with it; no worker is started for it.
    Fixed, the same load answers READY and the model serves."""
    shutil.copytree(repository / "bad", repository / "truncated")
    config = repository / "truncated" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "bad"', 'name: "truncated"'))
    good = (repository / "digits" / "1" / "model.onnx").read_bytes()
    (repository / "truncated" / "1" / "model.onnx").write_bytes(good[: len(good) // 2])
    (repository / "pyinit" / "1").mkdir(parents=True)
    (repository / "pyinit" / "config.pbtxt").write_text(
        'name: "pyinit"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    (repository / "pyinit" / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def initialize(self, args):\n"
        "        raise RuntimeError('weights file is missing')\n\n"
        "    def execute(self, requests):\n        return []\n"
    )
    server = naiad_server(repository, extra_env=ENV, extra_args=[
        "--model-control-mode", "explicit", "--load-model", "digits"])  # fmt: skip
    http = httpclient.InferenceServerClient(server.url, network_timeout=60)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        error = failure(lambda: http.load_model("bad"))
        assert error.status() == "400" and f"failed to load 'bad': {LOAD_ERROR}" in error.message()
        assert_unavailable_with_the_load_error(server)
        error = failure(lambda: grpc.load_model("truncated"))
        assert "failed to load 'truncated': unable to load model 'truncated' version 1 (onnxruntime)" in (
            error.message())
        assert not grpc.is_model_ready("truncated")
        error = failure(lambda: http.load_model("pyinit"))
        assert error.status() == "400" and error.message() == (
            "failed to load 'pyinit': failed to load model 'pyinit': initialize() raised RuntimeError: "
            "weights file is missing")
        reason = index_entry(server, "pyinit")["reason"]
        assert reason.endswith("initialize() raised RuntimeError: weights file is missing")
        assert starts(server, "bad") == starts(server, "truncated") == starts(server, "pyinit") == 0

        fix(repository)
        http.load_model("bad")
        assert http.is_model_ready("bad")
    finally:
        http.close()
        grpc.close()
    assert index_entry(server) == {"name": "bad", "version": "1", "state": "READY"}  # no reason: none
    np.testing.assert_array_equal(infer_http(server), infer_http(server, "digits"))
