"""Triton's Python backend end to end: ``model.py`` files written for Triton (only the
``triton_python_backend_utils`` API, see ``python_models/``) served by ``naiad serve`` and
called with NVIDIA's tritonclient.

One server (embedded Redis, a repository of those models plus the example ``digits``) is
shared by the module; the finalize test runs its own server with a short idle timeout.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from naiad_harness import run_server, wait_for
from tritonclient.utils import InferenceServerException

MODELS = Path(__file__).parent / "python_models"


#: ``digits_levels``: ``digits`` with two priority levels; level 2 rejects what waits 1 µs.
LEVELS = """dynamic_batching {
  priority_levels: 2
  default_priority_level: 1
  priority_queue_policy { key: 2 value { timeout_action: REJECT default_timeout_microseconds: 1 } }
"""

#: ``digits_via_ensemble``: an ensemble of one step, ``digits``.
ENSEMBLE = """name: "digits_via_ensemble"
platform: "ensemble"
max_batch_size: 64
input [ { name: "input" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "label" data_type: TYPE_INT64 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "digits" model_version: -1
  input_map { key: "input" value: "input" } output_map { key: "label" value: "label" } } ] }
"""


def build_repository(folder: Path, example_repository: Path, finalize_file: Path) -> Path:
    """The test models, ``inspect_args`` told where ``finalize`` writes, ``digits``,
    ``digits_levels`` and ``digits_via_ensemble``."""
    shutil.copytree(MODELS, folder)
    config = folder / "inspect_args" / "config.pbtxt"
    config.write_text(config.read_text().replace("@FINALIZE_FILE@", str(finalize_file)))
    shutil.copytree(example_repository / "digits", folder / "digits")
    shutil.copytree(example_repository / "digits", folder / "digits_levels")
    config = folder / "digits_levels" / "config.pbtxt"
    text = config.read_text().replace('name: "digits"', 'name: "digits_levels"')
    config.write_text(text.replace("dynamic_batching {\n", LEVELS))
    (folder / "digits_via_ensemble" / "1").mkdir(parents=True)
    (folder / "digits_via_ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    return folder


@pytest.fixture(scope="module")
def server(example_repository, tmp_path_factory):
    work = tmp_path_factory.mktemp("python_backend")
    repository = build_repository(work / "models", example_repository, work / "finalized.json")
    with run_server(repository, work / "server") as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    triton = httpclient.InferenceServerClient(server.url, network_timeout=60, concurrency=8)
    yield triton
    triton.close()


def tensor(name: str, array: np.ndarray, datatype: str, binary: bool = True) -> httpclient.InferInput:
    item = httpclient.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array, binary_data=binary)
    return item


def failure(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_add_sub_as_written_for_triton(server, client):
    a = np.array([1.5, 2.0, -3.0, 4.25], dtype=np.float32)
    b = np.array([0.5, 5.0, 1.0, 0.25], dtype=np.float32)
    result = client.infer("add_sub", [tensor("INPUT0", a, "FP32"), tensor("INPUT1", b, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert result.as_numpy("OUTPUT1").dtype == np.int32  # the config's data_type, read in initialize
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), (a - b).astype(np.int32))

    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [grpcclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    answer = grpc.infer("add_sub", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), (a - b).astype(np.int32))
    assert answer.as_numpy("OUTPUT0") is None  # not requested: not sent
    grpc.close()


def test_initialize_args_and_request_fields(client):
    outputs = [httpclient.InferRequestedOutput(n) for n in ("ARGS", "REQUEST")]
    result = client.infer(
        "inspect_args", [tensor("IN", np.array([7], dtype=np.int32), "INT32")], outputs=outputs,
        request_id="req-7", parameters={"color": "blue", "level": 3},
    )  # fmt: skip
    assert result.as_numpy("EXTRA") is None
    args = json.loads(result.as_numpy("ARGS")[0])
    assert set(args) == {"model_config", "model_instance_kind", "model_instance_name",
                         "model_instance_device_id", "model_repository", "model_version", "model_name"}
    assert all(isinstance(value, str) for value in args.values())
    assert (args["model_name"], args["model_version"]) == ("inspect_args", "1")
    assert (args["model_instance_kind"], args["model_instance_device_id"]) == ("CPU", "0")
    assert args["model_instance_name"] == "inspect_args_0"  # no instance_group: Triton's name
    assert (Path(args["model_repository"]) / "1" / "model.py").is_file()
    config = json.loads(args["model_config"])  # Triton's JSON: proto names, ints, defaults
    assert config["name"] == "inspect_args" and config["max_batch_size"] == 0
    assert config["input"][0]["dims"] == [1] and config["input"][0]["data_type"] == "TYPE_INT32"
    assert [o["data_type"] for o in config["output"]] == ["TYPE_STRING", "TYPE_STRING", "TYPE_FP32"]
    assert config["parameters"]["finalize_file"]["string_value"].endswith("finalized.json")

    seen = json.loads(result.as_numpy("REQUEST")[0])
    assert seen["request_id"] == "req-7"
    assert seen["parameters"] == {"color": "blue", "level": 3}
    assert seen["requested_output_names"] == ["ARGS", "REQUEST"]
    assert (seen["model_name"], seen["model_version"], seen["in"]) == ("inspect_args", 1, [7])
    assert seen["initialize_thread_local"]  # execute runs on initialize's thread, as in Triton

    every = client.infer("inspect_args", [tensor("IN", np.array([1], dtype=np.int32), "INT32")])
    assert every.as_numpy("EXTRA").tolist() == [1.5]  # no outputs asked: all of them
    assert json.loads(every.as_numpy("REQUEST")[0])["requested_output_names"] == ["ARGS", "EXTRA", "REQUEST"]


def test_dynamic_batch_is_one_execute_with_per_request_errors(client):
    """Five requests queued while ``batcher`` cold-starts reach one ``execute`` call; a
    response's error fails only its own request, with Triton's status for its code."""
    values = [1.0, 2.0, -1.0, -400.0, 3.0]
    pending = [
        client.async_infer("batcher", [tensor("INPUT0", np.array([[v]], dtype=np.float32), "FP32")],
                           request_id=f"r{i}")
        for i, v in enumerate(values)
    ]  # fmt: skip
    outcomes = {}
    for i, request in enumerate(pending):
        try:
            outcomes[i] = request.get_result()
        except InferenceServerException as exc:
            outcomes[i] = exc
    for i in (0, 1, 4):
        assert outcomes[i].as_numpy("OUTPUT0").tolist() == [[values[i] * 2]]
        assert outcomes[i].as_numpy("REQUESTS").tolist() == [[5]]
    assert outcomes[2].status() == "500" and "negative input in request 'r2'" in outcomes[2].message()
    assert outcomes[3].status() == "400" and "-400 is not a valid input" in outcomes[3].message()


def executions(client, model: str) -> int:
    """Batches ``model`` executed successfully so far (a failed execute call counts none)."""
    return int(client.get_inference_statistics(model)["model_stats"][0]["execution_count"])


def test_exception_in_execute_fails_its_batch_only(client):
    before = executions(client, "batcher")
    unlucky = client.async_infer("batcher", [tensor("INPUT0", np.array([[13.0]], dtype=np.float32), "FP32")])
    other = client.async_infer("batcher", [tensor("INPUT0", np.array([[4.0]], dtype=np.float32), "FP32")])
    error = failure(unlucky.get_result)
    assert error.status() == "500"
    assert "unlucky 13" in error.message() and "TritonModelException" in error.message()
    try:
        alone = other.get_result()  # a batch of its own: served, and that batch counted
        assert alone.as_numpy("REQUESTS").tolist() == [[1]]
        assert executions(client, "batcher") == before + 1
    except InferenceServerException as exc:
        # Failed too: only right if it shared the unlucky execute call. Had it run in a batch
        # of its own that then got the error (a leak), that batch would have been counted.
        assert "unlucky 13" in exc.message()
        assert executions(client, "batcher") == before
    after = client.infer("batcher", [tensor("INPUT0", np.array([[5.0]], dtype=np.float32), "FP32")])
    assert after.as_numpy("OUTPUT0").tolist() == [[10.0]]  # the worker serves on


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes_in_and_out(client, binary):
    text = np.array([b"abc", "héllo".encode(), b""], dtype=np.object_)
    result = client.infer("strings", [tensor("TEXT", text, "BYTES", binary)],
                          outputs=[httpclient.InferRequestedOutput(n, binary_data=binary)
                                   for n in ("UPPER", "LENGTH")])  # fmt: skip
    upper = [v.encode() if isinstance(v, str) else v for v in result.as_numpy("UPPER").tolist()]
    assert upper == [b"ABC", "HÉLLO".encode(), b""]  # tritonclient gives JSON strings as str
    assert result.as_numpy("LENGTH").tolist() == [3, 6, 0]


def test_bls_calls_digits_through_its_queue(server, client, digits_onnx, digits_holdout):
    assert server.workers("digits") == 0  # BLS wakes a model at zero workers
    x = np.ascontiguousarray(digits_holdout[0][:5])
    result = client.infer("bls", [tensor("PIXELS", x, "FP32")])
    expected = digits_onnx.run(["label"], {"input": x})[0]
    np.testing.assert_array_equal(result.as_numpy("LABEL"), expected)
    stats = client.get_inference_statistics("digits")["model_stats"][0]["inference_stats"]
    assert int(stats["success"]["count"]) >= 1  # counted as the target's request


@pytest.mark.parametrize(
    ("parameters", "status", "message"),
    [
        ({"target": "nope"}, "500", "BLS failed: Model nope - Error when running inference: Failed for "
         "execute the inference request. Model 'nope' is not ready."),
        ({"version": 7}, "500", "BLS failed: Model digits - Error when running inference: Failed for "
         "execute the inference request. Model 'digits' is not ready."),
        ({"target": "add_sub"}, "500", "BLS failed: unexpected inference input 'input' for model 'add_sub'"),
    ],
    ids=["unknown-model", "unknown-version", "bad-input"],
)  # fmt: skip
def test_bls_errors_come_back_in_the_response(client, digits_holdout, parameters, status, message):
    """Every BLS error has code INTERNAL, as Triton 2.51's stub gives them (the test model
    answers with the error's code: 500); an unknown target is worded as Triton words it."""
    x = np.ascontiguousarray(digits_holdout[0][:2])
    error = failure(lambda: client.infer("bls", [tensor("PIXELS", x, "FP32")], parameters=parameters))
    assert (error.status(), error.message()) == (status, message)


def test_bls_is_queued_by_the_targets_priority_levels_and_policies(client, digits_onnx, digits_holdout):
    """A BLS call waits at the priority level its ``priority`` parameter names, under that
    level's queue policy, as a client's request does: level 2 of ``digits_levels`` rejects."""
    x = np.ascontiguousarray(digits_holdout[0][:3])
    pixels = [tensor("PIXELS", x, "FP32")]
    expected = digits_onnx.run(["label"], {"input": x})[0]
    served = client.infer("bls", pixels, parameters={"target": "digits_levels", "call_priority": 1})
    np.testing.assert_array_equal(served.as_numpy("LABEL"), expected)
    direct = failure(lambda: client.infer("digits_levels", [tensor("input", x, "FP32")], priority=2))
    assert (direct.status(), direct.message()) == ("503", "Request timeout expired")
    parameters = {"target": "digits_levels", "call_priority": 2}
    error = failure(lambda: client.infer("bls", pixels, parameters=parameters))
    assert (error.status(), error.message()) == ("500", "BLS failed: Request timeout expired")


def test_bls_to_an_ensemble_fails_at_once(client, digits_holdout):
    """Naiad runs ensembles in the gateway, so a BLS call to one fails at once (not after its
    timeout); the ensemble itself serves clients."""
    x = np.ascontiguousarray(digits_holdout[0][:2])
    assert client.infer("digits_via_ensemble", [tensor("input", x, "FP32")]).as_numpy("label").shape == (2, 1)
    parameters = {"target": "digits_via_ensemble", "call_timeout": 20_000_000}
    started = time.monotonic()
    error = failure(lambda: client.infer("bls", [tensor("PIXELS", x, "FP32")], parameters=parameters))
    assert time.monotonic() - started < 10
    assert error.status() == "500"  # INTERNAL, as every BLS error
    assert error.message() == (
        "BLS failed: Model digits_via_ensemble - Error when running inference: BLS requests to "
        "ensemble models are not supported in Naiad: call the composing models of 'digits_via_ensemble'"
    )


def test_async_bls_with_calls_in_flight(client, digits_onnx, digits_holdout):
    x = np.ascontiguousarray(digits_holdout[0][10:16])
    result = client.infer("bls_async", [tensor("PIXELS", x, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("LABEL"), digits_onnx.run(["label"], {"input": x})[0])


def test_execute_may_run_an_event_loop_of_its_own_however_quick(client):
    """Quick batches still run where no event loop runs (a batch run on the worker's own
    loop would fail ``asyncio.run`` there: docs/benchmarks.md, "Stop 22")."""
    for value in range(8):
        x = np.array([value], np.float32)
        result = client.infer("own_event_loop", [tensor("X", x, "FP32")])
        assert result.as_numpy("Y").tolist() == [2.0 * value]


def test_auto_complete_config(client):
    config = client.get_model_config("auto")
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [(i["name"], i["data_type"], [int(d) for d in i["dims"]]) for i in config["input"]] == [
        ("X", "TYPE_FP32", [2])]
    assert [o["name"] for o in config["output"]] == ["Y"]
    x = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    result = client.infer("auto", [tensor("X", x, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("Y"), x * 10)  # FACTOR from a sibling module


def test_model_whose_initialize_raises(client):
    error = failure(lambda: client.infer("broken", [tensor("IN", np.array([1.0], dtype=np.float32), "FP32")]))
    assert error.status() == "400"
    assert "initialize() raised TritonModelException: weights file is missing" in error.message()


def test_finalize_runs_when_the_worker_exits(tmp_path, example_repository):
    repository, finalized = tmp_path / "models", tmp_path / "finalized.json"
    build_repository(repository, example_repository, finalized)
    with run_server(repository, tmp_path / "server", idle_timeout_s=1.0) as running:
        triton = httpclient.InferenceServerClient(running.url, network_timeout=60)
        triton.infer("inspect_args", [tensor("IN", np.array([1], dtype=np.int32), "INT32")])
        triton.close()
        assert not finalized.exists()  # still serving
        wait_for(finalized.exists, 30, "finalize() to write its file after the idle exit")
    # initialize, execute and finalize on one thread, as Triton's stub calls them
    assert json.loads(finalized.read_text()) == {"model_name": "inspect_args", "executions": 1, "threads": 1}


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("undeclared", "the response of model 'misbehaving' has no output 'Y' (requested); it has 'W', "
                       "which the model configuration does not declare"),
        ("none", "the response of model 'misbehaving' has no output 'Y', 'Z' (requested)"),
        ("int32", "model 'misbehaving' returned a bad output: configuration expects datatype TYPE_FP32 "
                  "for output 'Y', model provides TYPE_INT32"),
        ("wide", "model 'misbehaving' returned a bad output: output 'Y' has shape [1, 5], its "
                 "configuration expects [1, 4] (-1: any size)"),
        ("rows", "model 'misbehaving' returned a bad output: output 'Y' has shape [2, 4], its "
                 "configuration expects [1, 4] (-1: any size)"),
    ],
)  # fmt: skip
def test_outputs_that_contradict_the_config_fail_the_request(client, mode, message):
    """Outputs named by the request: each must be there (a request naming none gets what the
    model gave, as from Triton)."""
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    named = [httpclient.InferRequestedOutput(name) for name in ("Y", "Z")]
    error = failure(lambda: client.infer("misbehaving", [tensor("X", x, "FP32")], outputs=named,
                                         parameters={"mode": mode}))  # fmt: skip
    assert (error.status(), error.message()) == ("500", message)


def test_only_declared_and_requested_outputs_are_sent(server, client):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    every = client.infer("misbehaving", [tensor("X", x, "FP32")])
    assert sorted(output["name"] for output in every.get_response()["outputs"]) == ["Y", "Z"]  # no 'W'
    np.testing.assert_array_equal(every.as_numpy("Y"), x * 2)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    item = grpcclient.InferInput("X", [2, 4], "FP32")
    item.set_data_from_numpy(x)
    only_z = grpc.infer("misbehaving", [item], outputs=[grpcclient.InferRequestedOutput("Z")])
    assert [output.name for output in only_z.get_response().outputs] == ["Z"]
    grpc.close()
