"""``gateway/shared_memory.py`` without a server: real POSIX shared memory objects made by
``tritonclient.utils.shared_memory`` (what clients use), mapped by :class:`SystemSharedMemory`."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from gateway.grpc_codec import from_infer_request, to_parameters
from gateway.http_codec import parse_infer_request
from gateway.shared_memory import SystemSharedMemory, read_tensor, shared_memory_ref
from naiad.errors import AlreadyExists, InvalidInput, NaiadError, PayloadTooLarge, RegionNotFound, Unsupported
from naiad.inference import InferRequest, InferResponse, RequestedOutput, SharedMemoryRef, Tensor


@pytest.fixture
def segment():
    """``(key, handle)`` of a fresh 8 KiB object holding 0..2047 as FP32, destroyed after."""
    key = f"/naiad_unit_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("unit", key, 8192)
    shm.set_shared_memory_region(handle, [np.arange(2048, dtype=np.float32)])
    yield key, handle
    shm.destroy_shared_memory_region(handle)


def _request(ref: SharedMemoryRef) -> InferRequest:
    return InferRequest("m", 1, [], [RequestedOutput("y", shared_memory=ref)])


def test_a_region_at_an_offset_reads_and_writes_its_own_bytes(segment):
    key, handle = segment
    manager = SystemSharedMemory(max_read_bytes=1 << 20)
    manager.register("r", key, offset=4096, byte_size=4096)  # floats 1024..2047
    data = read_tensor(manager, SharedMemoryRef("r", 16, offset=8), "x", "FP32", [4])
    np.testing.assert_array_equal(data, [1026, 1027, 1028, 1029])
    ref = SharedMemoryRef("r", 8, offset=16)
    with manager.hold(_request(ref)):
        answer = InferResponse("m", 1, [Tensor("y", "INT32", [2], np.array([7, 9], np.int32))])
        manager.write_outputs(_request(ref), answer)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [2], offset=4096 + 16), [7, 9])
    assert manager.status() == [{"name": "r", "key": key, "offset": 4096, "byte_size": 4096}]


def test_a_region_in_use_is_not_unregistered_until_its_request_ends(segment):
    key, _ = segment
    manager = SystemSharedMemory(max_read_bytes=1 << 20)
    manager.register("busy", key, 0, 64)
    manager.register("idle", key, 64, 64)
    with manager.hold(_request(SharedMemoryRef("busy", 16))):
        with pytest.raises(InvalidInput, match="region 'busy', it is currently in use."):
            manager.unregister("busy")
        with pytest.raises(InvalidInput, match="Failed to unregister the following system .* regions: busy"):
            manager.unregister()
        assert [r["name"] for r in manager.status()] == ["busy"]  # the idle one went
    manager.unregister("busy")
    assert manager.status() == []


def test_registration_errors_leave_the_manager_as_it_was(segment):
    key, _ = segment
    manager = SystemSharedMemory(max_read_bytes=1 << 20, max_regions=2)
    manager.register("a", key, 0, 8192)
    with pytest.raises(AlreadyExists, match="shared memory region 'a' already in manager"):
        manager.register("a", key, 0, 8)
    for bad_key in ("", "/", "../etc/passwd", "a/b", "/naiad_unit_missing"):
        with pytest.raises(InvalidInput, match="Unable to open shared memory region"):
            manager.register("b", bad_key, 0, 8)
    for offset, size in ((0, 8193), (8192, 1), (0, 0)):
        with pytest.raises(InvalidInput, match="failed to register shared memory region 'b': invalid args"):
            manager.register("b", key, offset, size)
    manager.register("b", key, 0, 8)
    with pytest.raises(InvalidInput, match="2 regions are registered already"):
        manager.register("c", key, 0, 8)
    assert [r["name"] for r in manager.status()] == ["a", "b"]
    with pytest.raises(RegionNotFound, match="Unable to find system shared memory region: 'c'"):
        manager.status("c")
    manager.close()
    assert manager.status() == []


def test_reads_are_bounded_and_checked(segment):
    key, _ = segment
    manager = SystemSharedMemory(max_read_bytes=1024)
    manager.register("r", key, 0, 8192)
    with pytest.raises(PayloadTooLarge, match="1024 bytes per request"):
        manager.read(SharedMemoryRef("r", 2048), "x")
    assert len(manager.bounded(4096).read(SharedMemoryRef("r", 2048), "x")) == 2048  # gRPC's view
    with pytest.raises(InvalidInput, match="Invalid offset for shared memory region: 'r'"):
        manager.read(SharedMemoryRef("r", 4, offset=8192), "x")
    with pytest.raises(InvalidInput, match="Invalid offset \\+ byte size for shared memory region: 'r'"):
        manager.read(SharedMemoryRef("r", 8, offset=8188), "x")
    with pytest.raises(RegionNotFound, match="Unable to find shared memory region: 'q'"):
        manager.read(SharedMemoryRef("q", 8), "x")
    with pytest.raises(InvalidInput, match="Expected 16, got 12"):
        read_tensor(manager, SharedMemoryRef("r", 12), "x", "FP32", [4])
    with pytest.raises(Unsupported):
        read_tensor(None, SharedMemoryRef("r", 16), "x", "FP32", [4])


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"shared_memory_region": 3, "shared_memory_byte_size": 4}, "expected a string"),
        ({"shared_memory_region": "r"}, "'shared_memory_byte_size' must be given"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": True}, "non-negative integer"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": 4, "shared_memory_offset": -1},
         "non-negative"),
        ({"shared_memory_offset": 4}, "'shared_memory_offset' can not be specified without"),
    ],
)
def test_tensor_parameters_are_checked(parameters, message):
    with pytest.raises(InvalidInput, match=message):
        shared_memory_ref(parameters, "x")


def test_tensor_parameters_name_a_span():
    assert shared_memory_ref({}, "x") is None
    params = {"shared_memory_region": "r", "shared_memory_byte_size": 4, "shared_memory_offset": 8}
    assert shared_memory_ref(params, "x") == SharedMemoryRef("r", 4, 8)


# --- fuzzing both codecs' shared memory parameters (bounded; see tests/fuzzing.py) ---------

PARAM = (
    st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats(allow_nan=False)
    | st.sampled_from(["r", "gone", ""]) | st.integers(0, 300) | st.lists(st.integers(0, 3), max_size=2)
)  # fmt: skip
NAMES = ["shared_memory_region", "shared_memory_byte_size", "shared_memory_offset", "binary_data",
         "classification", "binary_data_size"]  # fmt: skip


@pytest.fixture(scope="module")
def fuzz_manager():
    key = f"/naiad_fuzz_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("fuzz", key, 256)
    manager = SystemSharedMemory(max_read_bytes=128)
    manager.register("r", key, 0, 256)
    yield manager
    manager.close()
    shm.destroy_shared_memory_region(handle)


@fuzz_settings(300)
@given(inputs=st.dictionaries(st.sampled_from(NAMES), PARAM, max_size=4),
       outputs=st.dictionaries(st.sampled_from(NAMES), PARAM, max_size=4), data=st.booleans())  # fmt: skip
def test_any_shared_memory_parameters_parse_or_fail_cleanly(fuzz_manager, inputs, outputs, data):
    """HTTP and gRPC: an InferRequest whose input has its shape's bytes, or a NaiadError."""
    spec = {"name": "x", "datatype": "FP32", "shape": [4], "parameters": inputs}
    if data:
        spec["data"] = [1.0, 2.0, 3.0, 4.0]
    body = json.dumps({"inputs": [spec], "outputs": [{"name": "y", "parameters": outputs}]}).encode()
    try:
        request = parse_infer_request(body, None, "m", 1, fuzz_manager)
        assert request.inputs[0].data.shape == (4,)
        with fuzz_manager.hold(request):
            pass
    except NaiadError:
        pass
    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="x", datatype="FP32", shape=[4])
    requested = message.outputs.add(name="y")
    try:
        for target, params in ((tensor.parameters, inputs), (requested.parameters, outputs)):
            for key, value in params.items():
                target[key].CopyFrom(to_parameters({key: value})[key])
    except (TypeError, ValueError):
        return  # no InferParameter holds it: nothing a client can send
    if data:
        message.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    try:
        request = from_infer_request(message, "m", 1, fuzz_manager)
        assert request.inputs[0].data.shape == (4,)
    except NaiadError:
        pass


def test_an_object_shrunk_after_registering_fails_the_request_not_the_gateway(segment):
    """A client that truncates its object after the register call: a mapped access would be
    SIGBUS for the whole gateway (this test process included); here the read and the write
    of that request fail with a clear error, nothing else happens, and the object is not
    grown back."""
    import os  # noqa: PLC0415

    key, _ = segment
    manager = SystemSharedMemory(max_read_bytes=1 << 20)
    manager.register("r", key, offset=0, byte_size=8192)
    os.truncate(f"/dev/shm{key}", 1024)
    with pytest.raises(InvalidInput, match="smaller than when it was registered"):
        read_tensor(manager, SharedMemoryRef("r", 4096, offset=2048), "x", "FP32", [1024])
    ref = SharedMemoryRef("r", 16, offset=4096)
    answer = InferResponse("m", 1, [Tensor("y", "FP32", [4], np.ones(4, np.float32))])
    with pytest.raises(InvalidInput, match="smaller than when it was registered"):
        with manager.hold(_request(ref)):
            manager.write_outputs(_request(ref), answer)
    assert os.stat(f"/dev/shm{key}").st_size == 1024
    inside = read_tensor(manager, SharedMemoryRef("r", 16), "x", "FP32", [4])  # what is left still reads
    np.testing.assert_array_equal(inside, [0, 1, 2, 3])
