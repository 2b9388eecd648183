"""Every call of the four tritonclient flavours that Naiad implements, against one server.

Each test runs once per client (``tritonclient.http``, ``.http.aio``, ``.grpc``, ``.grpc.aio``)
through :class:`conformance_client.Client`; what exists in only some clients (gRPC streams,
HTTP JSON tensors, ``async_infer``) has its own test.
"""

from __future__ import annotations

import asyncio
import queue
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.utils.shared_memory as shm
from conformance_client import CALL_TIMEOUT_S, Client, digits_row, http_status, ints, unpack
from tritonclient.utils import InferenceServerException

from gateway.dataplane import EXTENSIONS

MODELS = ["digits", "reshape_scalar", "silero_vad", "spare", "versioned"]
STAT_KINDS = [
    "success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss",
]  # fmt: skip


def fails(client: Client, call, *args, **kwargs) -> int:
    """The HTTP status (gRPC codes mapped) with which ``client(call, ...)`` fails."""
    with pytest.raises(InferenceServerException) as caught:
        client(call, *args, **kwargs)
    return http_status(caught.value)


def reference(digits_onnx, x: np.ndarray) -> dict[str, np.ndarray]:
    names = [o.name for o in digits_onnx.get_outputs()]
    return dict(zip(names, digits_onnx.run(names, {"input": x}), strict=True))


# --- health, metadata, configuration -----------------------------------------------------------


def test_server_live_and_ready(client):
    assert client("is_server_live") is True
    assert client("is_server_ready") is True


def test_model_ready_with_versions(client):
    for model in MODELS:
        assert client("is_model_ready", model) is True, model
    assert client("is_model_ready", "versioned", "1") is True
    assert client("is_model_ready", "versioned", "2") is True
    assert client("is_model_ready", "versioned", "3") is False
    assert client("is_model_ready", "no_such_model") is False


def test_server_metadata_lists_exactly_the_extensions(client):
    metadata = client("get_server_metadata")
    assert metadata["name"] == "naiad" and metadata["version"]
    assert metadata["extensions"] == EXTENSIONS
    assert EXTENSIONS == [
        "classification", "binary_tensor_data", "model_configuration", "statistics", "model_repository",
        "system_shared_memory",
    ]  # fmt: skip


def test_model_metadata(client):
    metadata = client("get_model_metadata", "reshape_scalar")
    assert (metadata["name"], metadata["versions"], metadata["platform"]) == (
        "reshape_scalar", ["1"], "onnxruntime_onnx",
    )  # fmt: skip
    for kind, name in (("inputs", "x"), ("outputs", "y")):
        tensors = [(t["name"], t["datatype"], ints(t["shape"])) for t in metadata[kind]]
        assert tensors == [(name, "INT64", [-1, 1])]
    assert client("get_model_metadata", "versioned")["versions"] == ["1", "2"]
    versioned = client("get_model_metadata", "versioned", "1")
    assert versioned["versions"] == ["1"]  # the version asked for, as Triton answers
    assert ints(versioned["inputs"][0]["shape"]) == [-1, -1]
    assert fails(client, "get_model_metadata", "versioned", "3") == 404
    assert fails(client, "get_model_metadata", "no_such_model") == 404


def test_model_config(client):
    """Triton's model configuration extension, the config as parsed (proto field names)."""
    config = client("get_model_config", "reshape_scalar")
    assert config["name"] == "reshape_scalar" and int(config["max_batch_size"]) == 8
    assert config["input"][0]["data_type"] == "TYPE_INT64" and ints(config["input"][0]["dims"]) == [1]
    assert "reshape" in config["input"][0] and "reshape" in config["output"][0]
    if not client.grpc:  # HTTP: Triton's ModelConfigToJson, 64-bit integers as numbers
        assert (config["max_batch_size"], config["input"][0]["dims"]) == (8, [1])
    assert client("get_model_config", "versioned", "2")["version_policy"] == {"all": {}}
    digits = client("get_model_config", "digits")
    unset = None if client.grpc else ""  # HTTP prints every default, gRPC's protobuf JSON none
    assert {o["name"]: o.get("label_filename") for o in digits["output"]} == {
        "probabilities": "labels.txt", "label": unset,
    }  # fmt: skip
    assert fails(client, "get_model_config", "versioned", "3") == 404
    assert fails(client, "get_model_config", "no_such_model") == 404


# --- model repository extension ----------------------------------------------------------------


def test_repository_index(client):
    rows = client("get_model_repository_index")
    index = {item["name"]: item for item in rows}
    assert sorted(index) == MODELS
    assert {item["state"] for item in rows} == {"READY"}
    # One row per served version, as Triton lists them (version_policy all: 1 and 2).
    assert [item["version"] for item in rows if item["name"] == "versioned"] == ["1", "2"]


def test_unload_then_load(client):
    """Unload makes the model unready (and unserved), load brings it back; the others stay."""
    client("unload_model", "spare")
    try:
        assert client("is_model_ready", "spare") is False
        entry = next(i for i in client("get_model_repository_index") if i["name"] == "spare")
        assert entry["state"] == "UNAVAILABLE" and entry["reason"] == "unloaded"
        tensor = {"x": (np.zeros((1, 2), np.float32), "FP32")}
        with pytest.raises(InferenceServerException) as caught:
            client.infer("spare", tensor)
        # Triton: a model unloaded in explicit mode is unknown, 404 / NOT_FOUND.
        assert http_status(caught.value) == 404
        assert "unloaded" in caught.value.message()
        assert fails(client, "get_model_metadata", "spare") == 404
        assert client("is_model_ready", "digits") is True
    finally:
        client("load_model", "spare")
    assert client("is_model_ready", "spare") is True
    assert fails(client, "load_model", "no_such_model") == 404


# --- statistics extension ------------------------------------------------------------------------


def test_statistics(client):
    before = client("get_inference_statistics", "versioned", "1")["model_stats"]
    client.infer("versioned", {"x": (np.ones((1, 2), np.float32), "FP32")}, model_version="1")
    stats = client("get_inference_statistics", "versioned", "1")["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [("versioned", "1")]
    count = int(stats[0].get("inference_count", 0))
    assert count == int(before[0].get("inference_count", 0)) + 1
    assert int(stats[0]["execution_count"]) >= 1
    assert set(stats[0]["inference_stats"]) == set(STAT_KINDS)  # gRPC JSON drops zero fields only
    assert int(stats[0]["inference_stats"]["success"]["count"]) == count
    both = client("get_inference_statistics", "versioned")["model_stats"]
    assert sorted(s["version"] for s in both) == ["1", "2"]
    every = client("get_inference_statistics")["model_stats"]
    assert {s["name"] for s in every} == set(MODELS)
    assert fails(client, "get_inference_statistics", "versioned", "3") == 404
    assert fails(client, "get_inference_statistics", "no_such_model") == 404


# --- inference ------------------------------------------------------------------------------------


def test_infer_binary_tensor_data(client, digits_onnx):
    """Binary tensor data over HTTP; gRPC sends raw contents (typed ones: the raw module)."""
    check_digits(client, digits_onnx, binary=True)


def test_infer_json_tensors(http_client, digits_onnx):
    check_digits(http_client, digits_onnx, binary=False)


def check_digits(client, digits_onnx, binary: bool) -> None:
    x = (np.arange(3 * 64, dtype=np.float32).reshape(3, 64) % 17).astype(np.float32)
    outputs, response = client.infer("digits", {"input": (x, "FP32")}, ["probabilities", "label"], binary)
    want = reference(digits_onnx, x)
    np.testing.assert_allclose(outputs["probabilities"], want["probabilities"], rtol=1e-5)
    np.testing.assert_array_equal(outputs["label"], want["label"])
    assert (response["model_name"], response["model_version"]) == ("digits", "1")
    if not client.grpc:
        sizes = ["binary_data_size" in o.get("parameters", {}) for o in response["outputs"]]
        assert sizes == [binary, binary]


@pytest.mark.parametrize("batch", [1, 8])
def test_reshape_to_scalar(client, batch):
    x = np.arange(batch, dtype=np.int64).reshape(batch, 1) * 10 - 3
    outputs, _ = client.infer("reshape_scalar", {"x": (x, "INT64")})
    assert outputs["y"].shape == (batch, 1)
    np.testing.assert_array_equal(outputs["y"], x + 1)


def test_reshape_to_scalar_refuses_a_batch_over_the_max(client):
    with pytest.raises(InferenceServerException) as caught:
        client.infer("reshape_scalar", {"x": (np.zeros((9, 1), np.int64), "INT64")})
    assert http_status(caught.value) == 400


@pytest.mark.parametrize(("version", "added"), [("", 2.0), ("2", 2.0), ("1", 1.0)])
def test_version_selection(client, version, added):
    x = np.array([[0.5, -1.0]], np.float32)
    outputs, response = client.infer("versioned", {"x": (x, "FP32")}, model_version=version)
    np.testing.assert_array_equal(outputs["y"], x + added)
    assert response["model_version"] == (version or "2")


def test_unknown_version_is_not_found(client):
    with pytest.raises(InferenceServerException) as caught:
        client.infer("versioned", {"x": (np.ones((1, 2), np.float32), "FP32")}, model_version="3")
    assert http_status(caught.value) == 404


def test_classification(client, digits_onnx):
    """Triton's classification extension: ``value:index:label`` (``value:index`` without a
    label file), highest first, one row per batch entry; values as C++ ``std::to_string``."""
    x = np.ones((2, 64), np.float32) * np.array([[1.0], [9.0]], np.float32)
    outputs, _ = client.infer("digits", {"input": (x, "FP32")}, [("probabilities", 3), ("label", 1)])
    want = reference(digits_onnx, x)
    assert outputs["probabilities"].shape == (2, 3)
    for row, probabilities in zip(outputs["probabilities"], want["probabilities"], strict=True):
        parts = [item.decode().split(":") for item in row]
        order = np.argsort(-probabilities, kind="stable")[:3]
        assert [int(index) for _, index, _ in parts] == order.tolist()
        assert [label for _, _, label in parts] == [index for _, index, _ in parts]  # labels "0".."9"
        assert float(parts[0][0]) == pytest.approx(float(probabilities.max()), abs=1e-6)
    labels = [item.decode() for item in outputs["label"].reshape(-1)]
    assert labels == [f"{int(v)}:0" for v in want["label"].reshape(-1)]  # INT64: no decimals


def test_request_id_is_echoed(client):
    _, response = client.infer("digits", digits_row(), request_id="conformance-id-1")
    assert response["id"] == "conformance-id-1"
    _, response = client.infer("digits", digits_row())
    assert response.get("id", "") == ""


def test_custom_request_parameters_pass(client):
    parameters = {"my_text": "hello", "my_int": 7, "my_flag": True}
    outputs, _ = client.infer("digits", digits_row(), parameters=parameters)
    assert outputs["label"].shape == (1, 1)


def test_priority_and_timeout(client):
    outputs, _ = client.infer("digits", digits_row(2), priority=2, timeout=30_000_000)
    assert outputs["label"].shape == (2, 1)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compression(client, digits_onnx, coding):
    """HTTP: compressed request body and response (Content-Encoding / Accept-Encoding);
    gRPC: the channel's message compression."""
    extra = (
        {"compression_algorithm": coding}
        if client.grpc
        else {"request_compression_algorithm": coding, "response_compression_algorithm": coding}
    )
    x = np.ones((4, 64), np.float32)
    outputs, _ = client.infer("digits", {"input": (x, "FP32")}, **extra)
    np.testing.assert_array_equal(outputs["label"], reference(digits_onnx, x)["label"])


def test_async_infer(client):
    """``async_infer`` (sync clients) or concurrent ``infer`` calls (aio clients): each answer
    belongs to its own request."""
    rows = {str(i): np.full((1, 2), i, np.float32) for i in range(6)}

    def tensors(array):
        return [client.input("x", array, "FP32")]

    if client.kind == "http":
        def body(triton):
            pending = {k: triton.async_infer("versioned", tensors(a), request_id=k) for k, a in rows.items()}
            return {k: unpack(p.get_result(timeout=CALL_TIMEOUT_S), False) for k, p in pending.items()}
    elif client.kind == "grpc":
        def body(triton):
            answers: queue.Queue = queue.Queue()
            for key, array in rows.items():
                callback = lambda result, error: answers.put((result, error))  # noqa: E731
                triton.async_infer("versioned", tensors(array), callback, request_id=key)
            replies = [answers.get(timeout=CALL_TIMEOUT_S) for _ in rows]
            assert [error for _, error in replies if error is not None] == []
            return {r.get_response().id: unpack(r, True) for r, _ in replies}
    else:
        async def body(triton):
            calls = [triton.infer("versioned", tensors(a), request_id=k) for k, a in rows.items()]
            results = await asyncio.gather(*calls)
            return {key: unpack(r, client.grpc) for key, r in zip(rows, results, strict=True)}

    answers = client.run(body)
    assert sorted(answers) == sorted(rows)
    for key, (outputs, response) in answers.items():
        assert response["id"] == key
        np.testing.assert_array_equal(outputs["y"], rows[key] + 2)


# --- gRPC streaming -----------------------------------------------------------------------------


def stream_inputs(module, i: int):
    tensor = module.InferInput("x", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.full((1, 2), i, np.float32))
    return [tensor]


def check_stream(replies: list, sent: dict[str, str]) -> None:
    """One reply per request; the ``bad`` one an error that names it, the rest correct."""
    assert len(replies) == len(sent)
    errors = [error for _, error in replies if error is not None]
    assert len(errors) == 1 and "version 3" in errors[0].message()
    for result, error in replies:
        if error is None:
            response = result.get_response()
            added = 1.0 if sent[response.id] == "1" else 2.0
            assert response.model_version == (sent[response.id] or "2")
            np.testing.assert_array_equal(result.as_numpy("y"), np.full((1, 2), int(response.id) + added))


STREAM = {"0": "", "1": "1", "2": "3", "3": "2", "4": ""}  # request id -> model_version


def test_grpc_stream_sync(server):
    answers: queue.Queue = queue.Queue()
    triton = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        triton.start_stream(callback=lambda result, error: answers.put((result, error)))
        for key, version in STREAM.items():
            inputs = stream_inputs(grpcclient, int(key))
            triton.async_stream_infer("versioned", inputs, model_version=version, request_id=key)
        replies = [answers.get(timeout=CALL_TIMEOUT_S) for _ in STREAM]
        triton.stop_stream()
    finally:
        triton.close()
    check_stream(replies, STREAM)


def test_grpc_stream_aio(server):
    async def requests():
        for key, version in STREAM.items():
            yield {
                "model_name": "versioned", "inputs": stream_inputs(grpcaio, int(key)),
                "model_version": version, "request_id": key,
            }  # fmt: skip

    async def main():
        triton = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            replies = []
            async for reply in triton.stream_infer(requests(), stream_timeout=CALL_TIMEOUT_S):
                replies.append(reply)
                if len(replies) == len(STREAM):
                    break
            return replies
        finally:
            await triton.close()

    check_stream(asyncio.run(asyncio.wait_for(main(), CALL_TIMEOUT_S)), STREAM)


def test_system_shared_memory(client, digits_onnx):
    """Input from and output to a region made by tritonclient's own library, registered,
    read back in the status and unregistered with each client flavour."""
    x = (np.arange(3 * 64, dtype=np.float32).reshape(3, 64) % 13).astype(np.float32)
    in_bytes, out_bytes = x.nbytes, 3 * 10 * 4
    key = f"/naiad_conformance_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("conformance", key, in_bytes + out_bytes)
    try:
        shm.set_shared_memory_region(handle, [x])
        client("register_system_shared_memory", "conformance", key, in_bytes + out_bytes)
        status = client("get_system_shared_memory_status")
        regions = list(status.get("regions", {}).values()) if client.grpc else status
        assert [(r["name"], r["key"], int(r["byte_size"])) for r in regions] == [
            ("conformance", key, in_bytes + out_bytes)
        ]
        tensor = client.module.InferInput("input", [3, 64], "FP32")
        tensor.set_shared_memory("conformance", in_bytes)
        output = client.module.InferRequestedOutput("probabilities")
        output.set_shared_memory("conformance", out_bytes, offset=in_bytes)
        client("infer", "digits", [tensor], outputs=[output])
        got = shm.get_contents_as_numpy(handle, np.float32, [3, 10], offset=in_bytes)
        np.testing.assert_allclose(got, reference(digits_onnx, x)["probabilities"], rtol=1e-5)
    finally:
        client("unregister_system_shared_memory")
        shm.destroy_shared_memory_region(handle)
    status = client("get_system_shared_memory_status")
    assert not (status.get("regions") if client.grpc else status)


# --- what Naiad deliberately does not implement -------------------------------------------------

UNIMPLEMENTED = {
    "cuda_shared_memory": [
        ("get_cuda_shared_memory_status", ()),
        ("unregister_cuda_shared_memory", ()),
    ],
    "trace": [("get_trace_settings", ()), ("update_trace_settings", ("digits", {"trace_level": ["OFF"]}))],
    "logging": [("get_log_settings", ()), ("update_log_settings", ({"log_verbose_level": 0},))],
}


@pytest.mark.parametrize("family", list(UNIMPLEMENTED))
def test_unimplemented_extensions_fail_cleanly(client, family):
    """gRPC: UNIMPLEMENTED; HTTP: an error status (no such route). The server goes on."""
    for call, args in UNIMPLEMENTED[family]:
        status = fails(client, call, *args)
        assert status == 501 if client.grpc else 400 <= status < 600, (call, status)
    assert client("is_server_ready") is True


#: Each extension the server lists, and the test of this suite that exercises it.
EXERCISED = {
    "classification": test_classification,
    "binary_tensor_data": test_infer_binary_tensor_data,
    "model_configuration": test_model_config,
    "statistics": test_statistics,
    "model_repository": test_unload_then_load,
    "system_shared_memory": test_system_shared_memory,
}


def test_every_listed_extension_is_exercised():
    assert sorted(EXERCISED) == sorted(EXTENSIONS)
    assert all(callable(test) and test.__name__.startswith("test_") for test in EXERCISED.values())
