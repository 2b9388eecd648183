"""Triton's model repository extension and model control modes (none, poll, explicit), end to
end on real ``naiad serve`` processes, driven by NVIDIA's tritonclient (http and grpc)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import boto3
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from naiad_harness import upload_tree, wait_for
from tritonclient.utils import InferenceServerException

POLL_S = 1
#: How long a poll-mode change may take to show: a period, the re-index, and a margin.
POLL_WAIT_S = 15
#: A worker notices an unload on its next heartbeat (2 s by default).
DRAIN_WAIT_S = 20
EXPLICIT = ["--model-control-mode", "explicit", "--load-model", "digits"]
POLL = ["--model-control-mode", "poll", "--repository-poll-secs", str(POLL_S)]


@pytest.fixture
def repository(tmp_path: Path, example_repository: Path) -> Path:
    """A private copy of the example repository that a test may change."""
    return Path(shutil.copytree(example_repository, tmp_path / "models"))


def index(server) -> dict[str, dict]:
    triton = httpclient.InferenceServerClient(server.url)
    try:
        return {item["name"]: item for item in triton.get_model_repository_index()}
    finally:
        triton.close()


def ready(server, model: str) -> bool:
    triton = httpclient.InferenceServerClient(server.url)
    try:
        return triton.is_model_ready(model)
    finally:
        triton.close()


def infer_digits(server, model: str = "digits") -> np.ndarray:
    triton = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("input", [2, 64], "FP32")
        tensor.set_data_from_numpy(np.ones((2, 64), np.float32))
        return triton.infer(model, [tensor]).as_numpy("label")
    finally:
        triton.close()


def infer_silero(url: str) -> np.ndarray:
    triton = grpcclient.InferenceServerClient(url)
    try:
        inputs = []
        for name, array, datatype in (
            ("input", np.zeros((1, 512), np.float32), "FP32"),
            ("state", np.zeros((2, 1, 128), np.float32), "FP32"),
            ("sr", np.array([16000], np.int64), "INT64"),
        ):
            tensor = grpcclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        return triton.infer("silero_vad", inputs, client_timeout=60).as_numpy("output")
    finally:
        triton.close()


def copy_model(repository: Path, source: str, name: str) -> None:
    """``source`` copied as a new model ``name`` (config name changed to match), written
    aside and renamed into place so a poll never sees half a folder."""
    staging = repository.parent / f".{name}"
    shutil.copytree(repository / source, staging)
    config = staging / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{source}"', f'name: "{name}"'))
    staging.rename(repository / name)


def test_none_mode_indexes_everything_and_refuses_load_unload(naiad_server):
    server = naiad_server()
    listed = index(server)
    for name in ("digits", "silero_vad"):
        assert listed[name] == {"name": name, "version": "1", "state": "READY"}  # no reason: none
    only_ready = requests.post(f"{server.http}/v2/repository/index", json={"ready": True}, timeout=5)
    assert only_ready.status_code == 200 and {m["name"] for m in only_ready.json()} >= {"digits"}
    assert "model_repository" in requests.get(f"{server.http}/v2", timeout=5).json()["extensions"]

    triton = httpclient.InferenceServerClient(server.url)
    try:
        with pytest.raises(InferenceServerException, match="not allowed"):
            triton.load_model("digits")
        with pytest.raises(InferenceServerException, match="not allowed"):
            triton.unload_model("digits")
    finally:
        triton.close()
    answer = requests.post(f"{server.http}/v2/repository/models/digits/unload", timeout=5)
    assert answer.status_code == 400 and "not allowed" in answer.json()["error"]
    grpc_triton = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        models = {m.name: m for m in grpc_triton.get_model_repository_index().models}
        assert models["digits"].state == "READY" and models["digits"].version == "1"
        with pytest.raises(InferenceServerException, match="not allowed"):
            grpc_triton.unload_model("digits")
    finally:
        grpc_triton.close()
    assert ready(server, "digits")


def test_explicit_mode_load_and_unload(redis_url, naiad_server, repository):
    (repository / "broken").mkdir()
    (repository / "broken" / "config.pbtxt").write_text("this is { not a config")
    server = naiad_server(repository, redis_url=redis_url, extra_args=EXPLICIT)
    listed = index(server)
    assert listed["digits"]["state"] == "READY"
    assert listed["silero_vad"] == {"name": "silero_vad", "state": "UNAVAILABLE", "reason": "unloaded"}
    assert not ready(server, "silero_vad")
    with pytest.raises(InferenceServerException, match="unloaded") as refused:
        infer_silero(server.grpc_url)
    assert refused.value.status() == "StatusCode.NOT_FOUND"  # Triton: an unloaded model is unknown
    answer = requests.get(f"{server.http}/v2/models/silero_vad", timeout=5)
    assert answer.status_code == 404 and "unknown model" in answer.json()["error"]
    answer = requests.get(f"{server.http}/v2/models/silero_vad/ready", timeout=5)
    assert answer.status_code == 400
    assert answer.json() == {"error": "model 'silero_vad' is not ready: unloaded"}

    grpc_triton = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        grpc_triton.load_model("silero_vad")
        assert grpc_triton.is_model_ready("silero_vad")
        with pytest.raises(InferenceServerException, match="does not parse"):
            grpc_triton.load_model("broken")
        with pytest.raises(InferenceServerException, match="not in the repository"):
            grpc_triton.load_model("nonexistent")
    finally:
        grpc_triton.close()
    assert infer_silero(server.grpc_url).shape == (1, 1)
    assert index(server)["broken"]["state"] == "UNAVAILABLE"
    assert "does not parse" in index(server)["broken"]["reason"]
    answer = requests.get(f"{server.http}/v2/models/broken/ready", timeout=5)
    assert answer.status_code == 400 and "does not parse" in answer.json()["error"]  # the index's reason

    # A second gateway on the same Redis sees the unload within its sync interval.
    other = naiad_server(repository, redis_url=redis_url, command="gateway", extra_args=EXPLICIT)
    assert infer_digits(other).shape == (2, 1)
    [worker] = server.worker_processes("digits")
    triton = httpclient.InferenceServerClient(server.url)
    try:
        triton.unload_model("digits", unload_dependents=True)
        assert not triton.is_model_ready("digits")
        with pytest.raises(InferenceServerException, match="unloaded"):
            infer_digits(server)
    finally:
        triton.close()
    wait_for(lambda: not ready(other, "digits"), 5, "the other gateway to see the unload")
    assert index(server)["digits"] == {"name": "digits", "version": "1", "state": "UNAVAILABLE",
                                       "reason": "unloaded"}
    wait_for(lambda: not worker.is_running() or worker.status() == "zombie", DRAIN_WAIT_S,
             "the unloaded model's worker to exit")
    assert infer_silero(server.grpc_url).shape == (1, 1)  # the others keep serving


def test_explicit_load_with_config_override(naiad_server):
    server = naiad_server(extra_args=EXPLICIT)
    triton = httpclient.InferenceServerClient(server.url)
    try:
        config = triton.get_model_config("digits")
        config["dynamic_batching"]["max_queue_delay_microseconds"] = 1234
        triton.load_model("digits", config=json.dumps(config))
        assert triton.get_model_config("digits")["dynamic_batching"]["max_queue_delay_microseconds"] == 1234
        with pytest.raises(InferenceServerException, match="does not match"):
            triton.load_model("digits", config=json.dumps({**config, "name": "other"}))
        grpc_triton = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException, match="not supported"):
            grpc_triton.load_model("digits", config=json.dumps(config), files={"file:1/model.onnx": b"x"})
        grpc_triton.close()
        triton.load_model("digits")  # back to config.pbtxt
        assert triton.get_model_config("digits")["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    finally:
        triton.close()
    assert infer_digits(server).shape == (2, 1)


def test_poll_mode_follows_the_local_repository(naiad_server, repository):
    server = naiad_server(repository, extra_args=POLL)
    expected = infer_digits(server)
    [worker] = server.worker_processes("digits")
    with pytest.raises(InferenceServerException, match="polling"):
        httpclient.InferenceServerClient(server.url).load_model("digits")

    copy_model(repository, "digits", "digits_copy")
    wait_for(lambda: ready(server, "digits_copy"), POLL_WAIT_S, "the new model to become ready")
    np.testing.assert_array_equal(infer_digits(server, "digits_copy"), expected)

    (repository / "broken").mkdir()
    (repository / "broken" / "config.pbtxt").write_text('name: "broken" max_batch_size: [')
    wait_for(lambda: "broken" in index(server), POLL_WAIT_S, "the broken model to be indexed")
    assert index(server)["broken"]["state"] == "UNAVAILABLE"
    assert "does not parse" in index(server)["broken"]["reason"]
    answer = requests.get(f"{server.http}/v2/models/broken/ready", timeout=5)
    assert answer.status_code == 400 and "does not parse" in answer.json()["error"]  # the index's reason
    np.testing.assert_array_equal(infer_digits(server), expected)  # the others keep serving

    shutil.rmtree(repository / "digits_copy")
    wait_for(lambda: not ready(server, "digits_copy"), POLL_WAIT_S, "the removed model to go")
    assert "digits_copy" not in index(server)

    # A changed config takes effect, and the worker that loaded the old one drains away.
    config = repository / "digits" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_queue_delay_microseconds: 2000",
                                                 "max_queue_delay_microseconds: 3000"))
    triton = httpclient.InferenceServerClient(server.url)
    try:
        wait_for(lambda: triton.get_model_config("digits")["dynamic_batching"]
                 ["max_queue_delay_microseconds"] == 3000, POLL_WAIT_S, "the changed config")
    finally:
        triton.close()
    wait_for(lambda: not worker.is_running() or worker.status() == "zombie", DRAIN_WAIT_S,
             "the worker of the old config to exit")
    np.testing.assert_array_equal(infer_digits(server), expected)


def test_poll_mode_follows_an_s3_repository(naiad_server, s3_endpoint, s3_bucket, repository):
    upload_tree(s3_endpoint, s3_bucket, repository, "models")
    host_port = s3_endpoint.removeprefix("http://")
    server = naiad_server(repository=f"s3://{host_port}/{s3_bucket}/models", extra_args=POLL)
    assert "digits_s3" not in index(server)

    copy_model(repository, "digits", "digits_s3")
    upload_tree(s3_endpoint, s3_bucket, repository / "digits_s3", "models/digits_s3")
    wait_for(lambda: ready(server, "digits_s3"), POLL_WAIT_S, "the uploaded model to become ready")
    assert infer_digits(server, "digits_s3").shape == (2, 1)

    bucket = boto3.resource("s3", endpoint_url=s3_endpoint).Bucket(s3_bucket)
    bucket.objects.filter(Prefix="models/digits_s3/").delete()
    wait_for(lambda: not ready(server, "digits_s3"), POLL_WAIT_S, "the deleted model to go")
    assert ready(server, "digits")
