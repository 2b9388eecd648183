"""Triton's system shared memory extension end to end: a real ``naiad serve``, real workers,
regions made with ``tritonclient.utils.shared_memory`` exactly as Triton's own examples
(``simple_http_shm_client.py``, ``simple_grpc_shm_client.py``) make them, and tritonclient
http and grpc as the clients. The repository is the example ``digits`` and ``cached`` (the
same model with ``response_cache { enable: true }``)."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils as tritonclient_utils
import tritonclient.utils.shared_memory as shm
from naiad_harness import run_server
from tritonclient.utils import InferenceServerException

ROWS = 3
IN_BYTES, PROB_BYTES, LABEL_BYTES = ROWS * 64 * 4, ROWS * 10 * 4, ROWS * 8


@pytest.fixture(scope="module")
def repository(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shm") / "models"
    shutil.copytree(example_repository / "digits", root / "digits")
    shutil.copytree(example_repository / "digits", root / "cached")
    config = root / "cached" / "config.pbtxt"
    text = config.read_text().replace('name: "digits"', 'name: "cached"')
    config.write_text(text + "response_cache { enable: true }\n")
    shutil.copytree(Path(__file__).parent / "python_models" / "strings", root / "strings")
    return root


@pytest.fixture(scope="module")
def serve(repository, tmp_path_factory):
    args = ["--cache-config=redis,max_bytes=1048576"]
    with run_server(repository, tmp_path_factory.mktemp("shm-serve"), extra_args=args) as server:
        yield server


@pytest.fixture(scope="module")
def http(serve):
    client = httpclient.InferenceServerClient(serve.url, network_timeout=60)
    yield client
    client.unregister_system_shared_memory()
    client.close()


@pytest.fixture(scope="module")
def grpc(serve):
    client = grpcclient.InferenceServerClient(serve.grpc_url)
    yield client
    client.close()


@pytest.fixture
def regions():
    """Factory ``regions(name, byte_size) -> (key, handle)``: shared memory objects made by
    tritonclient's own library, destroyed after the test."""
    made = []

    def create(name: str, byte_size: int):
        key = f"/naiad_test_{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(name, key, byte_size)
        made.append(handle)
        return key, handle

    yield create
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def digits(holdout, start: int) -> np.ndarray:
    return np.ascontiguousarray(holdout[0][start : start + ROWS], dtype=np.float32)


def reference(session, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(probabilities, label)`` of the very ONNX file the server serves."""
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, {"input": x}), strict=True))
    return outputs["probabilities"], outputs["label"]


def failure(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def test_http_inputs_and_outputs_through_regions(http, regions, digits_onnx, digits_holdout):
    x = digits(digits_holdout, 0)
    in_key, in_handle = regions("in", IN_BYTES)
    out_key, out_handle = regions("out", PROB_BYTES + 16 + LABEL_BYTES)
    shm.set_shared_memory_region(in_handle, [x])
    http.register_system_shared_memory("h_in", in_key, IN_BYTES)
    http.register_system_shared_memory("h_out", out_key, PROB_BYTES + 16 + LABEL_BYTES)
    status = {r["name"]: r for r in http.get_system_shared_memory_status()}
    assert status["h_in"] == {"name": "h_in", "key": in_key, "offset": 0, "byte_size": IN_BYTES}
    assert http.get_system_shared_memory_status("h_out")[0]["byte_size"] == PROB_BYTES + 16 + LABEL_BYTES

    tensor = httpclient.InferInput("input", [ROWS, 64], "FP32")
    tensor.set_shared_memory("h_in", IN_BYTES)
    probabilities = httpclient.InferRequestedOutput("probabilities")
    probabilities.set_shared_memory("h_out", PROB_BYTES)
    label = httpclient.InferRequestedOutput("label")
    label.set_shared_memory("h_out", LABEL_BYTES, offset=PROB_BYTES + 16)
    result = http.infer("digits", [tensor], outputs=[probabilities, label])

    expected_p, expected_label = reference(digits_onnx, x)
    output = result.get_output("probabilities")
    assert output["shape"] == [ROWS, 10] and output["datatype"] == "FP32" and "data" not in output
    got_p = shm.get_contents_as_numpy(out_handle, np.float32, [ROWS, 10])
    np.testing.assert_allclose(got_p, expected_p, rtol=1e-5, atol=1e-6)
    got_label = shm.get_contents_as_numpy(out_handle, np.int64, [ROWS, 1], offset=PROB_BYTES + 16)
    np.testing.assert_array_equal(got_label, expected_label)
    http.unregister_system_shared_memory("h_in")
    http.unregister_system_shared_memory("h_out")
    assert http.get_system_shared_memory_status() == []


def test_grpc_offsets_and_outputs_mixed_with_the_response(grpc, regions, digits_onnx, digits_holdout):
    """Input at an offset in a region that itself starts at an offset of its object; one
    output to a region, the other in the response (raw_output_contents stay aligned)."""
    x = digits(digits_holdout, 10)
    key, handle = regions("both", 4096 + 128 + IN_BYTES + PROB_BYTES)
    shm.set_shared_memory_region(handle, [x], offset=4096 + 128)
    grpc.register_system_shared_memory("g_all", key, 128 + IN_BYTES + PROB_BYTES, offset=4096)
    status = grpc.get_system_shared_memory_status(as_json=True)["regions"]["g_all"]
    assert status["key"] == key and int(status["offset"]) == 4096

    tensor = grpcclient.InferInput("input", [ROWS, 64], "FP32")
    tensor.set_shared_memory("g_all", IN_BYTES, offset=128)
    probabilities = grpcclient.InferRequestedOutput("probabilities")
    probabilities.set_shared_memory("g_all", PROB_BYTES, offset=128 + IN_BYTES)
    result = grpc.infer("digits", [tensor], outputs=[probabilities, grpcclient.InferRequestedOutput("label")])

    expected_p, expected_label = reference(digits_onnx, x)
    np.testing.assert_array_equal(result.as_numpy("label"), expected_label)
    got_p = shm.get_contents_as_numpy(handle, np.float32, [ROWS, 10], offset=4096 + 128 + IN_BYTES)
    np.testing.assert_allclose(got_p, expected_p, rtol=1e-5, atol=1e-6)
    assert list(result.get_output("probabilities").shape) == [ROWS, 10]
    grpc.unregister_system_shared_memory()
    assert grpc.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}


def _shm_input(client_module, region: str, byte_size: int, offset: int = 0, rows: int = ROWS):
    tensor = client_module.InferInput("input", [rows, 64], "FP32")
    tensor.set_shared_memory(region, byte_size, offset=offset)
    return tensor


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_bad_regions_offsets_and_sizes_are_refused(module, http, grpc, regions, digits_holdout):
    client = http if module is httpclient else grpc
    key, handle = regions("bad", IN_BYTES)
    shm.set_shared_memory_region(handle, [digits(digits_holdout, 20)])
    client.register_system_shared_memory("bad", key, IN_BYTES)
    cases = [
        (_shm_input(module, "nowhere", IN_BYTES), "Unable to find shared memory region: 'nowhere'"),
        (_shm_input(module, "bad", 4, offset=IN_BYTES), "Invalid offset for shared memory region: 'bad'"),
        (_shm_input(module, "bad", IN_BYTES, offset=4),
         "Invalid offset + byte size for shared memory region: 'bad'"),
        (_shm_input(module, "bad", IN_BYTES - 4),  # the shape's bytes, not the region's
         f"input byte size mismatch for input 'input' in shared memory region 'bad'. Expected {IN_BYTES}"),
    ]
    for tensor, message in cases:
        assert message in failure(lambda t=tensor: client.infer("digits", [t])).message()
    small = module.InferRequestedOutput("probabilities")
    small.set_shared_memory("bad", PROB_BYTES - 4)
    error = failure(lambda: client.infer("digits", [_shm_input(module, "bad", IN_BYTES)], outputs=[small]))
    assert f"should be at least {PROB_BYTES} bytes to hold the results" in error.message()

    error = failure(lambda: client.register_system_shared_memory("bad", key, 8))
    assert "shared memory region 'bad' already in manager" in error.message()
    error = failure(lambda: client.register_system_shared_memory("big", key, IN_BYTES + 1))
    assert "failed to register shared memory region 'big': invalid args" in error.message()
    error = failure(lambda: client.register_system_shared_memory("none", "/naiad_no_such_key", 8))
    assert "Unable to open shared memory region: '/naiad_no_such_key'" in error.message()
    error = failure(lambda: client.get_system_shared_memory_status("none"))
    assert "Unable to find system shared memory region: 'none'" in error.message()
    client.unregister_system_shared_memory("never_registered")  # Triton: nothing to do, success

    # Nothing changed: the region still serves, and is the only one registered.
    result = client.infer("digits", [_shm_input(module, "bad", IN_BYTES)])
    assert result.as_numpy("label").shape == (ROWS, 1)
    client.unregister_system_shared_memory()
    assert "Unable to find shared memory region: 'bad'" in failure(
        lambda: client.infer("digits", [_shm_input(module, "bad", IN_BYTES)])
    ).message()


def test_http_malformed_parameters_never_mention_missing_data(serve, http, regions):
    key, _ = regions("raw", IN_BYTES)
    http.register_system_shared_memory("raw", key, IN_BYTES)
    url = f"{serve.http}/v2/models/digits/infer"

    def body(params: dict, **extra) -> dict:
        spec = {"name": "input", "shape": [ROWS, 64], "datatype": "FP32", "parameters": params}
        return {"inputs": [{**spec, **extra}]}

    cases = [
        (body({"shared_memory_region": "raw"}), 400, "'shared_memory_byte_size' must be given"),
        (body({"shared_memory_region": 7, "shared_memory_byte_size": 8}), 400, "expected a string"),
        (body({"shared_memory_byte_size": IN_BYTES}), 400,
         "can not be specified without 'shared_memory_region'"),
        (body({"shared_memory_region": "raw", "shared_memory_byte_size": -1}), 400, "non-negative integer"),
        (body({"shared_memory_region": "raw", "shared_memory_byte_size": IN_BYTES}, data=[1.0]), 400,
         "Input must set only one of the following fields"),
        (body({"shared_memory_region": "gone", "shared_memory_byte_size": IN_BYTES}), 404,
         "Unable to find shared memory region: 'gone'"),
    ]  # fmt: skip
    for payload, status, message in cases:
        response = requests.post(url, data=json.dumps(payload), timeout=30)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert message in error and "'data'" not in error.replace("'data', ", "").replace("set 'data'", "")
    both = body({"shared_memory_region": "raw", "shared_memory_byte_size": IN_BYTES})
    both["outputs"] = [{"name": "label", "parameters": {"shared_memory_region": "raw",
                                                       "shared_memory_byte_size": 24, "classification": 2}}]
    response = requests.post(url, data=json.dumps(both), timeout=30)
    assert response.status_code == 400
    assert "can't set both 'shared_memory_region' and 'classification'" in response.json()["error"]
    http.unregister_system_shared_memory("raw")


def test_register_body_errors_and_cuda_is_not_supported(serve, grpc):
    base = f"{serve.http}/v2/systemsharedmemory/region/r"
    bodies = [
        ({"byte_size": 8}, "no 'key' field"),
        ({"key": "/k"}, "no 'byte_size' field"),
        ({"key": "/k", "byte_size": "8"}, "'byte_size' must be a non-negative integer"),
    ]
    for payload, message in bodies:
        response = requests.post(f"{base}/register", data=json.dumps(payload), timeout=10)
        assert response.status_code == 400 and message in response.json()["error"]
    for method, path in [("GET", "status"), ("POST", "region/r/register"), ("POST", "unregister")]:
        response = requests.request(method, f"{serve.http}/v2/cudasharedmemory/{path}", timeout=10)
        assert response.status_code == 501
        assert "CUDA shared memory is not supported" in response.json()["error"]
    for call in (grpc.get_cuda_shared_memory_status, grpc.unregister_cuda_shared_memory):
        error = failure(call)
        assert error.status() == "StatusCode.UNIMPLEMENTED"
        assert "CUDA shared memory is not supported" in error.message()
    assert "system_shared_memory" in requests.get(f"{serve.http}/v2", timeout=10).json()["extensions"]


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_cached_answers_still_fill_the_output_region(module, serve, http, grpc, regions, digits_holdout):
    client = http if module is httpclient else grpc
    name = f"c_{module.__name__.split('.')[-1]}"
    x = digits(digits_holdout, 40 if module is httpclient else 50)
    key, handle = regions(name, IN_BYTES + PROB_BYTES)
    shm.set_shared_memory_region(handle, [x])
    client.register_system_shared_memory(name, key, IN_BYTES + PROB_BYTES)
    output = module.InferRequestedOutput("probabilities")
    output.set_shared_memory(name, PROB_BYTES, offset=IN_BYTES)

    def run() -> np.ndarray:
        client.infer("cached", [_shm_input(module, name, IN_BYTES)], outputs=[output])
        return shm.get_contents_as_numpy(handle, np.float32, [ROWS, 10], offset=IN_BYTES).copy()

    first = run()
    shm.set_shared_memory_region(handle, [np.zeros((ROWS, 10), np.float32)], offset=IN_BYTES)
    second = run()
    np.testing.assert_array_equal(second, first)
    assert first.sum() > 0
    stats = http.get_inference_statistics("cached")["model_stats"][0]["inference_stats"]
    assert int(stats["cache_hit"]["count"]) >= 1
    client.unregister_system_shared_memory(name)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_bytes_tensors_through_regions(module, http, grpc, regions):
    """BYTES in and out: 4-byte length-prefixed elements, as tritonclient serialises them."""
    client = http if module is httpclient else grpc
    text = np.array(["naiad", "shm", ""], dtype=np.object_)
    raw = tritonclient_utils.serialize_byte_tensor(text)
    name = f"b_{module.__name__.split('.')[-1]}"
    key, handle = regions(name, 4096)
    shm.set_shared_memory_region(handle, [raw])  # as Triton's simple_http_shm_string_client.py
    client.register_system_shared_memory(name, key, 4096)
    tensor = module.InferInput("TEXT", [3], "BYTES")
    tensor.set_shared_memory(name, tritonclient_utils.serialized_byte_size(raw))
    upper = module.InferRequestedOutput("UPPER")
    upper.set_shared_memory(name, 1024, offset=2048)
    result = client.infer("strings", [tensor], outputs=[upper, module.InferRequestedOutput("LENGTH")])
    np.testing.assert_array_equal(result.as_numpy("LENGTH"), [5, 3, 0])
    got = shm.get_contents_as_numpy(handle, np.object_, [3], offset=2048)
    assert [bytes(item) for item in got] == [b"NAIAD", b"SHM", b""]
    client.unregister_system_shared_memory(name)
