"""Every v2 datatype through the real server, with models whose configs are auto-completed.

The repository holds one ONNX ``Identity`` model per datatype and no ``config.pbtxt`` at
all (Triton's auto-complete fills platform, batching and tensors from the graph). Each is
called through ``tritonclient.http`` (JSON where the protocol allows it, and binary) and
``tritonclient.grpc``; the answer must equal the input bit for bit.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from naiad_harness import run_server
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

# v2 datatype -> (ONNX element type, sample data of shape [2, 3]).
SAMPLES = {
    "BOOL": (TensorProto.BOOL, np.array([[True, False, True], [False, False, True]])),
    "UINT8": (TensorProto.UINT8, np.array([[0, 1, 255], [7, 8, 9]], np.uint8)),
    "UINT16": (TensorProto.UINT16, np.array([[0, 1, 65535], [7, 8, 9]], np.uint16)),
    "UINT32": (TensorProto.UINT32, np.array([[0, 1, 2**32 - 1], [7, 8, 9]], np.uint32)),
    "UINT64": (TensorProto.UINT64, np.array([[0, 1, 2**64 - 1], [7, 8, 9]], np.uint64)),
    "INT8": (TensorProto.INT8, np.array([[-128, 0, 127], [7, -8, 9]], np.int8)),
    "INT16": (TensorProto.INT16, np.array([[-32768, 0, 32767], [7, -8, 9]], np.int16)),
    "INT32": (TensorProto.INT32, np.array([[-(2**31), 0, 2**31 - 1], [7, -8, 9]], np.int32)),
    "INT64": (TensorProto.INT64, np.array([[-(2**63), 0, 2**63 - 1], [7, -8, 9]], np.int64)),
    "FP16": (TensorProto.FLOAT16, np.array([[0.5, -1.25, 65504], [1e-3, 2, 3]], np.float16)),
    "FP32": (TensorProto.FLOAT, np.array([[0.5, -1.25, 3.4e38], [1e-30, 2, 3]], np.float32)),
    "FP64": (TensorProto.DOUBLE, np.array([[0.5, -1.25, 1e300], [1e-300, 2, 3]], np.float64)),
    "BF16": (TensorProto.BFLOAT16, np.array([[0.5, -1.25, 3e38], [1, 2, 3]], ml_dtypes.bfloat16)),
    "BYTES": (TensorProto.STRING, np.array([[b"", b"a", "é".encode()], [b"x" * 300, b"b", b"c"]], object)),
}
JSON_OK = [name for name in SAMPLES if name not in ("FP16", "BF16")]


def identity_model(elem: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", elem, ["batch", 3])
    y = helper.make_tensor_value_info("y", elem, ["batch", 3])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("datatypes")
    for name, (elem, _) in SAMPLES.items():
        folder = root / f"identity_{name.lower()}" / "1"
        folder.mkdir(parents=True)
        onnx.save(identity_model(elem), str(folder / "model.onnx"))
    with run_server(root, tmp_path_factory.mktemp("datatypes-server"), idle_timeout_s=120) as running:
        yield running


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == np.object_:  # JSON answers carry str, binary ones bytes
        as_bytes = [v.encode() if isinstance(v, str) else bytes(v) for v in got.ravel()]
        assert as_bytes == [bytes(v) for v in want.ravel()]
    else:
        assert got.dtype == want.dtype
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_binary_http_round_trip(server, datatype):
    data = SAMPLES[datatype][1]
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("x", list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=True)
    result = client.infer(f"identity_{datatype.lower()}", [tensor])
    assert_same(result.as_numpy("y"), data)


@pytest.mark.parametrize("datatype", JSON_OK)
def test_json_http_round_trip(server, datatype):
    data = SAMPLES[datatype][1]
    if datatype == "BYTES":  # JSON strings carry text only
        data = np.array([[b"", b"a", "é".encode()], [b"z", b"b", b"c"]], object)
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("x", list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=False)
    output = httpclient.InferRequestedOutput("y", binary_data=False)
    result = client.infer(f"identity_{datatype.lower()}", [tensor], outputs=[output])
    assert_same(result.as_numpy("y"), data)


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_grpc_round_trip(server, datatype):
    data = SAMPLES[datatype][1]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("x", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    result = client.infer(f"identity_{datatype.lower()}", [tensor])
    assert_same(result.as_numpy("y"), data)


def test_auto_completed_config_is_served(server):
    client = httpclient.InferenceServerClient(server.url)
    config = client.get_model_config("identity_fp32")
    assert config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 4
    assert config["input"][0]["dims"] == [3]
    metadata = client.get_model_metadata("identity_fp32")
    assert metadata["inputs"][0]["shape"] == [-1, 3]


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_json_is_refused(server, datatype):
    import requests

    body = {"inputs": [{"name": "x", "datatype": datatype, "shape": [1, 3], "data": [1, 2, 3]}]}
    url = f"{server.http}/v2/models/identity_{datatype.lower()}/infer"
    answer = requests.post(url, json=body, timeout=10)
    assert answer.status_code == 400 and "binary" in answer.json()["error"]


def test_non_utf8_bytes_reach_the_client_in_binary_only(server):
    """ONNX Runtime strings are UTF-8: raw non-UTF-8 bytes are refused with 400, not 500."""
    data = np.array([[b"\xff\xfe", b"a", b"b"]], object)
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("x", [1, 3], "BYTES")
    tensor.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as info:
        client.infer("identity_bytes", [tensor])
    assert info.value.status() == "400" and "UTF-8" in info.value.message()
