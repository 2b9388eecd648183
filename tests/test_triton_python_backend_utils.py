"""``triton_python_backend_utils``: the objects a Triton ``model.py`` builds and reads behave
as Triton's python_backend documents them."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils
from naiad.datatypes import bytes_elements


def test_tensor_holds_its_array_and_rejects_what_triton_rejects():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("x", array)
    assert (tensor.name(), tensor.shape(), tensor.triton_dtype()) == ("x", [2, 3], 11)
    assert tensor.as_numpy() is array and tensor.is_cpu()
    np.testing.assert_array_equal(pb_utils.Tensor.from_dlpack("y", tensor.to_dlpack()).as_numpy(), array)
    assert pb_utils.Tensor("s", np.array([b"a"], dtype=np.object_)).triton_dtype() == 13
    with pytest.raises(pb_utils.TritonModelException, match="np.object_"):
        pb_utils.Tensor("s", np.array(["text"]))
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("l", [1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("array", "number"),
    [(np.zeros(2, np.bool_), 1), (np.zeros(2, np.uint16), 3), (np.zeros(2, np.int64), 9),
     (np.zeros(2, np.float16), 10), (np.zeros(2, np.float64), 12), (np.array([b"ab"]), 13),
     (np.zeros(2, ">f4"), None), (np.zeros(2, np.complex64), None)],
    ids=["bool", "uint16", "int64", "fp16", "fp64", "byte-string", "big-endian", "complex"],
)  # fmt: skip
def test_a_tensor_numbers_its_dtype_as_triton_does(array, number):
    """The table lookup of the common case and the general rule give the same number
    (``numpy_to_triton_type``; None for a dtype without one)."""
    tensor = pb_utils.Tensor("t", array)
    assert tensor.triton_dtype() == number == pb_utils.numpy_to_triton_type(array.dtype)


def test_void_and_str_arrays_are_refused_with_or_without_a_triton_dtype():
    with pytest.raises(pb_utils.TritonModelException, match="np.object_"):
        pb_utils.Tensor("v", np.zeros(2, dtype="V4"))
    with pytest.raises(pb_utils.TritonModelException, match="np.object_"):
        pb_utils.Tensor("u", np.array(["text"]), triton_dtype=13)


def test_a_tensor_given_a_triton_dtype_views_its_array_as_that_type():
    tensor = pb_utils.Tensor("t", np.zeros(2, np.int32), triton_dtype=11)
    assert tensor.as_numpy().dtype == np.float32 and tensor.triton_dtype() == 11


def test_a_received_request_answers_as_one_built_by_keywords():
    """``InferenceRequest._received`` (the server's) and the keyword constructor (a model's
    BLS request) give requests whose every accessor agrees."""
    x = pb_utils.Tensor("x", np.zeros(1, dtype=np.float32))
    built = pb_utils.InferenceRequest(request_id="7", inputs=[x], requested_output_names=["y"],
                                      model_name="m", model_version=2, timeout=1500,
                                      parameters={"k": "v"})  # fmt: skip
    text = pb_utils._parameters_json({"k": "v"})  # as the server writes them (workers/backends/python.py)
    received = pb_utils.InferenceRequest._received("7", [x], ["y"], "m", 2, 1500, text)
    accessors = ["request_id", "correlation_id", "inputs", "requested_output_names", "model_name",
                 "model_version", "flags", "timeout", "parameters", "trace", "is_cancelled"]  # fmt: skip
    for name in accessors:
        assert getattr(received, name)() == getattr(built, name)(), name


def test_response_outputs_and_errors():
    out = pb_utils.Tensor("OUT", np.ones(2, dtype=np.int64))
    response = pb_utils.InferenceResponse(output_tensors=[out])
    assert not response.has_error() and response.error() is None
    assert pb_utils.get_output_tensor_by_name(response, "OUT") is out
    assert pb_utils.get_output_tensor_by_name(response, "other") is None
    failed = pb_utils.InferenceResponse(error=pb_utils.TritonError("boom"))
    assert failed.has_error() and failed.output_tensors() == []
    assert (failed.error().message(), failed.error().code()) == ("boom", pb_utils.TritonError.INTERNAL)
    assert pb_utils.TritonError("x", pb_utils.TritonError.NOT_FOUND).code() == 2
    with pytest.raises(pb_utils.TritonModelException, match="must be a list"):
        pb_utils.InferenceResponse(output_tensors=(out,))  # type: ignore[arg-type]
    assert pb_utils.TritonModelException("why").message() == "why"


def test_request_accessors_and_input_lookup():
    x = pb_utils.Tensor("x", np.zeros(1, dtype=np.float32))
    request = pb_utils.InferenceRequest(
        model_name="m", requested_output_names=["y"], inputs=[x], request_id="7",
        parameters={"k": "v", "n": 2}, timeout=1500,
    )  # fmt: skip
    assert pb_utils.get_input_tensor_by_name(request, "x") is x
    assert pb_utils.get_input_tensor_by_name(request, "z") is None
    assert (request.model_name(), request.model_version(), request.request_id()) == ("m", -1, "7")
    assert request.requested_output_names() == {"y"} and request.timeout() == 1500
    request.requested_output_names().add("z")  # a new set each call, as Triton's stub answers
    assert request.requested_output_names() == {"y"}
    assert request.parameters() == '{"k":"v","n":2}'  # compact, as Triton's stub writes it
    accented = pb_utils.InferenceRequest(model_name="m", requested_output_names=[], inputs=[],
                                         parameters={"s": "hé"})  # fmt: skip
    assert accented.parameters() == '{"s":"hé"}'  # UTF-8 kept, as Triton
    assert not request.is_cancelled()
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest(model_name="m", inputs=[x])  # requested_output_names missing


def test_bls_outside_a_worker_answers_an_error():
    request = pb_utils.InferenceRequest(model_name="m", requested_output_names=[], inputs=[])
    response = request.exec()
    assert response.has_error() and response.error().code() == pb_utils.TritonError.UNAVAILABLE

    async def call():
        return await request.async_exec()

    assert asyncio.run(call()).has_error()
    with pytest.raises(pb_utils.TritonModelException, match="decoupled"):
        request.exec(decoupled=True)


def test_config_lookups_and_dtype_helpers():
    config = {"input": [{"name": "A", "data_type": "TYPE_FP32"}],
              "output": [{"name": "B", "data_type": "TYPE_STRING"}]}  # fmt: skip
    assert pb_utils.get_input_config_by_name(config, "A")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_output_config_by_name(config, "B")["data_type"] == "TYPE_STRING"
    assert pb_utils.get_input_config_by_name(config, "B") is None
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_to_numpy_type(9) is np.int64 and pb_utils.numpy_to_triton_type(np.int64) == 9
    assert not pb_utils.using_decoupled_model_transaction_policy(config)


def test_bytes_serialization_round_trip():
    items = np.array([b"a", b"", "é".encode(), b"\x00z"], dtype=np.object_)
    flat = pb_utils.serialize_byte_tensor(items)
    assert type(flat) is bytes and flat[:5] == b"\x01\x00\x00\x00a"  # bytes, as Triton's helper
    assert pb_utils.deserialize_bytes_tensor(flat).tolist() == items.tolist()
    assert pb_utils.serialize_byte_tensor(np.zeros(2, dtype=np.float32)) is None
    assert pb_utils.serialize_byte_tensor(np.zeros(0, dtype=np.object_)) == ()


def test_bytes_serialization_takes_only_exact_bytes_as_they_are():
    """Triton's rule, the server's too (naiad.datatypes.bytes_elements): other elements are str()."""
    items = np.empty(5, dtype=np.object_)
    items[:] = [b"a", np.bytes_(b"b"), "é", 1.5, None]
    decoded = pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(items)).tolist()
    assert decoded == [b"a", b"b'b'", "é".encode(), b"1.5", b"None"]
    assert decoded == bytes_elements(items)
    fixed = np.array([b"x", b"yz"], dtype="S2")
    assert pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(fixed)).tolist() == [b"x", b"yz"]


def minimal_config() -> pb_utils.ModelConfig:
    return pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 0, "input": [
        {"name": "A", "data_type": "TYPE_FP32", "dims": [4]}], "output": []}))


def test_auto_complete_model_config_completes_and_refuses_conflicts():
    config = minimal_config()
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})  # the same: kept once
    config.add_input({"name": "B", "data_type": "TYPE_INT32", "dims": [-1], "optional": True})
    config.add_output({"name": "C", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    done = config.as_dict()
    assert [i["name"] for i in done["input"]] == ["A", "B"] and done["input"][1]["optional"]
    assert done["max_batch_size"] == 8 and done["dynamic_batching"] == {}
    with pytest.raises(ValueError, match="expects datatype TYPE_FP32"):
        config.add_input({"name": "A", "data_type": "TYPE_INT8", "dims": [4]})
    with pytest.raises(ValueError, match="expects dims"):
        config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [5]})
    with pytest.raises(ValueError, match="missing 'dims'"):
        config.add_output({"name": "D", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="max_batch_size 8"):
        config.set_max_batch_size(2)
    sequence = pb_utils.ModelConfig({"name": "s", "sequence_batching": {}})
    with pytest.raises(ValueError, match="sequence_batching"):
        sequence.set_dynamic_batching()
