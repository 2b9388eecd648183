"""The gRPC endpoint of a real ``naiad serve``, driven by NVIDIA's ``tritonclient.grpc`` (sync
and aio) and by the raw generated stub, checked against onnxruntime run on the served file."""

from __future__ import annotations

import asyncio
import queue

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from google.protobuf import text_format
from naiad_harness import run_server
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

MAX_BATCH = 64


@pytest.fixture(scope="module")
def grpc_url(example_repository, tmp_path_factory):
    """``127.0.0.1:PORT`` of the gRPC endpoint of a ``naiad serve`` for this module."""
    with run_server(example_repository, tmp_path_factory.mktemp("grpc")) as server:
        yield server.grpc_url


@pytest.fixture(scope="module")
def client(grpc_url):
    triton = grpcclient.InferenceServerClient(grpc_url)
    yield triton
    triton.close()


@pytest.fixture(scope="module")
def stub(grpc_url):
    channel = grpc.insecure_channel(
        grpc_url,
        options=[("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)],
    )
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def digits_input(x: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def reference(session, x: np.ndarray) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {"input": x}), strict=True))


def status_of(call) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value.status()


def test_health(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("digits")
    assert client.is_model_ready("digits", "1")
    assert not client.is_model_ready("no_such_model")


def test_server_metadata(client):
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "naiad"
    assert "model_configuration" in metadata["extensions"]


def test_model_metadata(client):
    metadata = client.get_model_metadata("digits")
    assert (metadata.name, list(metadata.versions), metadata.platform) == (
        "digits", ["1"], "onnxruntime_onnx",
    )  # fmt: skip
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [("input", "FP32", [-1, 64])]
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
        ("probabilities", "FP32", [-1, 10]),
        ("label", "INT64", [-1, 1]),
    ]


def test_model_config_is_the_completed_config_pbtxt(client, example_repository):
    text = (example_repository / "digits" / "config.pbtxt").read_text()
    parsed = text_format.Parse(text, model_config_pb2.ModelConfig())
    config = client.get_model_config("digits").config
    assert config.input == parsed.input and config.output == parsed.output
    assert config.max_batch_size == parsed.max_batch_size
    assert config.version_policy.latest.num_versions == 1  # Triton's default, filled in
    assert config.default_model_filename == "model.onnx"
    assert config.platform == "onnxruntime_onnx" and config.backend == "onnxruntime"


def test_digits_holdout_equals_onnxruntime(client, digits_onnx, digits_holdout):
    x, _ = digits_holdout
    for start in range(0, len(x), MAX_BATCH):
        batch = x[start : start + MAX_BATCH]
        result = client.infer("digits", [digits_input(batch)], request_id=f"rows-{start}")
        want = reference(digits_onnx, batch)
        np.testing.assert_allclose(
            result.as_numpy("probabilities"), want["probabilities"], rtol=1e-5, atol=1e-6
        )
        np.testing.assert_array_equal(result.as_numpy("label"), want["label"])
        response = result.get_response()
        assert (response.id, response.model_name, response.model_version) == (f"rows-{start}", "digits", "1")


def test_one_requested_output_and_explicit_version(client, digits_onnx, digits_holdout):
    x = digits_holdout[0][:5]
    outputs = [grpcclient.InferRequestedOutput("label")]
    result = client.infer("digits", [digits_input(x)], model_version="1", outputs=outputs)
    assert [o.name for o in result.get_response().outputs] == ["label"]
    np.testing.assert_array_equal(result.as_numpy("label"), reference(digits_onnx, x)["label"])


def typed_request(x: np.ndarray) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="digits", id="typed")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    tensor.contents.fp32_contents.extend(x.reshape(-1).tolist())
    return request


def raw_request(x: np.ndarray) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="digits", id="typed")
    request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.astype("<f4").tobytes())
    return request


def test_typed_contents_answer_as_raw_does(stub, digits_holdout):
    x = digits_holdout[0][:7]
    typed = stub.ModelInfer(typed_request(x))
    raw = stub.ModelInfer(raw_request(x))
    assert typed == raw
    assert len(typed.raw_output_contents) == 2  # outputs are always raw


def test_typed_contents_of_several_datatypes(stub, example_repository):
    """silero_vad takes FP32 and INT64 inputs: typed and raw requests answer the same."""
    t = np.arange(512, dtype=np.float32) / 16000
    audio = (0.5 * np.sin(2 * np.pi * 440 * t)).reshape(1, 512)
    state = np.zeros((2, 1, 128), np.float32)
    typed = service_pb2.ModelInferRequest(model_name="silero_vad")
    raw = service_pb2.ModelInferRequest(model_name="silero_vad")
    for name, datatype, array, field in (
        ("input", "FP32", audio, "fp32_contents"),
        ("state", "FP32", state, "fp32_contents"),
        ("sr", "INT64", np.array([16000], np.int64), "int64_contents"),
    ):
        tensor = typed.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        getattr(tensor.contents, field).extend(array.reshape(-1).tolist())
        raw.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        raw.raw_input_contents.append(array.tobytes())
    assert stub.ModelInfer(typed) == stub.ModelInfer(raw)


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda r: r.inputs[0].contents.fp32_contents.pop(), id="too-few-values"),
        pytest.param(lambda r: r.inputs[0].contents.int_contents.append(1), id="stray-field"),
        pytest.param(lambda r: r.raw_input_contents.append(b"\0" * 256), id="raw-and-typed"),
    ],
)
def test_bad_typed_contents_are_invalid_argument(stub, mutate):
    request = typed_request(np.ones((1, 64), np.float32))
    mutate(request)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_stream_survives_a_bad_request(client, digits_onnx, digits_holdout):
    x = digits_holdout[0][:5]
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(5):
            rows = x[i : i + 1] if i != 2 else np.ones((1, 63), np.float32)
            client.async_stream_infer("digits", [digits_input(rows)], request_id=str(i))
        replies = [answers.get(timeout=30) for _ in range(5)]
    finally:
        client.stop_stream()
    errors = [error for result, error in replies if error is not None]
    assert len(errors) == 1 and "unexpected shape" in errors[0].message()
    results = {result.get_response().id: result for result, error in replies if error is None}
    assert sorted(results) == ["0", "1", "3", "4"]
    for key, result in results.items():
        row = x[int(key) : int(key) + 1]
        np.testing.assert_array_equal(result.as_numpy("label"), reference(digits_onnx, row)["label"])


def test_aio_client(grpc_url, digits_onnx, digits_holdout):
    x = digits_holdout[0][:3]

    async def stream_requests():
        for i in range(3):
            rows = x[i : i + 1]
            yield {"model_name": "digits" if i != 1 else "no_such_model",
                   "inputs": [digits_input(rows)], "request_id": str(i)}  # fmt: skip

    async def main():
        triton = aioclient.InferenceServerClient(grpc_url)
        try:
            assert await triton.is_server_ready()
            assert await triton.is_model_ready("digits")
            result = await triton.infer("digits", [digits_input(x)])
            streamed = [reply async for reply in triton.stream_infer(stream_requests())]
            if len(streamed) < 3:
                raise AssertionError(f"stream ended early: {streamed}")
            return result, streamed
        finally:
            await triton.close()

    result, streamed = asyncio.run(asyncio.wait_for(main(), 60))
    np.testing.assert_array_equal(result.as_numpy("label"), reference(digits_onnx, x)["label"])
    ok = sorted(r.get_response().id for r, error in streamed if error is None)
    failed = [error.message() for r, error in streamed if error is not None]
    assert ok == ["0", "2"]
    assert len(failed) == 1 and "no_such_model" in failed[0]


def test_unknown_model_is_not_found(client):
    x = np.ones((1, 64), np.float32)
    assert status_of(lambda: client.infer("no_such_model", [digits_input(x)])) == "StatusCode.NOT_FOUND"
    assert status_of(lambda: client.get_model_metadata("no_such_model")) == "StatusCode.NOT_FOUND"
    assert status_of(lambda: client.infer("digits", [digits_input(x)], model_version="9")) == (
        "StatusCode.NOT_FOUND"
    )


def test_wrong_shape_is_invalid_argument(client):
    x = np.ones((1, 63), np.float32)
    assert status_of(lambda: client.infer("digits", [digits_input(x)])) == "StatusCode.INVALID_ARGUMENT"


def test_message_over_grpc_default_limit_is_read(stub):
    """6 MiB of raw data for a [1, 64] input: the server reads it (limit raised past grpcio's
    4 MiB) and rejects it for its content, not its size."""
    request = raw_request(np.ones((1, 64), np.float32))
    request.raw_input_contents[0] = b"\0" * (6 * 1024 * 1024)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "needs 256" in info.value.details()


def test_not_yet_implemented_extensions_are_unimplemented(client):
    assert status_of(lambda: client.get_trace_settings()) == "StatusCode.UNIMPLEMENTED"
    # The model repository extension is there; load/unload need --model-control-mode=explicit.
    assert status_of(lambda: client.load_model("digits")) == "StatusCode.UNAVAILABLE"


def test_classification_returns_top_classes_with_labels(client, digits_onnx):
    x = np.ones((2, 64), np.float32)
    outputs = [grpcclient.InferRequestedOutput("probabilities", class_count=3)]
    result = client.infer("digits", [digits_input(x)], outputs=outputs).as_numpy("probabilities")
    probabilities = digits_onnx.run(["probabilities"], {"input": x})[0]
    assert result.shape == (2, 3)
    for row, expected in zip(result, probabilities, strict=True):
        value, index, label = row[0].decode().split(":")
        assert int(index) == int(np.argmax(expected)) and label == index
        assert float(value) == pytest.approx(float(expected.max()), abs=1e-6)
