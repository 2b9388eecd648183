"""The Python backend without a server: real ``model.py`` files in a temporary repository,
loaded by :mod:`workers.backends.python` and run through ``execute_requests``."""

from __future__ import annotations

import sys
import textwrap
from http import HTTPStatus
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

import triton_python_backend_utils as pb_utils
from naiad.datatypes import datatype_of
from naiad.errors import InferenceFailed, ModelNotReady, NaiadError, Unsupported
from naiad.inference import InferRequest, RequestedOutput, Tensor
from repository_store import LocalStore, index_repository, parse_config
from workers.backends import load_backend
from workers.backends.python import OutputRule, output_fault

CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] {reshape} } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "Z" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def write_model(root: Path, name: str, source: str, config: str = CONFIG, filename: str = "model.py") -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config.replace("{reshape}", ""))
    (root / name / "1" / filename).write_text(textwrap.dedent(source))
    return root / name


def load(folder: Path, config_text: str | None = None):
    text = config_text if config_text is not None else (folder / "config.pbtxt").read_text()
    return load_backend(folder / "1", parse_config(text, folder.name), "cpu")


def request(value: float, outputs: tuple[str, ...] = (), rows: int = 1) -> InferRequest:
    x = np.full((rows, 4), value, dtype=np.float32)
    return InferRequest("m", 1, [Tensor("X", "FP32", [rows, 4], x)], [RequestedOutput(n) for n in outputs])


ECHO = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
                code = int(x.flat[0])
                if code < 0:
                    out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("no", -code - 1)))
                    continue
                ndim = np.array([[x.ndim]] * len(x), np.int32)
                tensors = [pb_utils.Tensor("Y", x + 1), pb_utils.Tensor("Z", ndim)]
                out.append(pb_utils.InferenceResponse(tensors))
            return out
"""


@pytest.mark.parametrize(
    ("code", "status"),
    [("UNKNOWN", 400), ("INTERNAL", 500), ("NOT_FOUND", 404), ("INVALID_ARG", 400), ("UNAVAILABLE", 503),
     ("UNSUPPORTED", 501), ("ALREADY_EXISTS", 400), ("CANCELLED", 400)],
)  # fmt: skip
def test_a_response_error_fails_its_request_with_tritons_status(tmp_path, code, status):
    backend = load(write_model(tmp_path, "m", ECHO))
    number = getattr(pb_utils.TritonError, code)
    good, bad = backend.execute_requests([request(1.0), request(-number - 1)])
    assert isinstance(bad, NaiadError) and bad.status == HTTPStatus(status) and bad.message == "no"
    assert [t.name for t in good] == ["Y", "Z"]
    np.testing.assert_array_equal(good[0].data, np.full((1, 4), 2.0, np.float32))


def test_only_requested_outputs_go_back(tmp_path):
    backend = load(write_model(tmp_path, "m", ECHO))
    (only_z,) = backend.execute_requests([request(1.0, outputs=("Z",))])
    assert [t.name for t in only_z] == ["Z"] and only_z[0].datatype == "INT32"


def test_input_reshape_is_applied(tmp_path):
    folder = write_model(tmp_path, "m", ECHO)
    reshaped = CONFIG.replace("{reshape}", "reshape: { shape: [ 2, 2 ] }")
    (outputs,) = load(folder, reshaped).execute_requests([request(3.0, outputs=("Z",), rows=2)])
    assert outputs[0].data.tolist() == [[3], [3]]  # the model saw [batch, 2, 2]


FAILED = "Failed to process the request(s) for model 'm_0', message: "


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("return []", "Number of InferenceResponse objects do not match the number of InferenceRequest "
                      "objects. InferenceRequest(s) size is:2, and InferenceResponse(s) size is:0\n"),
        ("return None", "Expected a list in the execute return, found type '<class 'NoneType'>'."),
        ("return (None, None)", "Expected a list in the execute return, found type '<class 'tuple'>'."),
        ("return [1, 2]", "Expected an 'InferenceResponse' object in the execute function return list, "
                          "found type '<class 'int'>'."),
        ("return [pb_utils.InferenceResponse([])] * 3", "Number of InferenceResponse objects do not match "
         "the number of InferenceRequest objects. InferenceRequest(s) size is:2, and InferenceResponse(s) "
         "size is:3\n"),
    ],
)  # fmt: skip
def test_a_bad_execute_fails_the_whole_batch_with_tritons_message(tmp_path, body, message):
    """Triton 2.51's texts, asked of real Triton (the stub checks the list, each item, the count)."""
    source = f"""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                {body}
    """
    backend = load(write_model(tmp_path, "m", source))
    with pytest.raises(InferenceFailed) as caught:
        backend.execute_requests([request(1.0), request(2.0)])
    assert caught.value.message == FAILED + message


@pytest.mark.parametrize("asynchronous", [False, True])
def test_an_exception_from_execute_names_the_models_frames_innermost_first(tmp_path, asynchronous):
    """As Triton's stub (pybind11's text): ``At:`` and one line a frame of the model's code, from
    the one that raised out to ``execute``; none of Naiad's (here ``pb_utils.Tensor``'s)."""
    source = f"""
        import triton_python_backend_utils as pb_utils

        def helper(x):
            return pb_utils.Tensor("Y", x)

        class TritonPythonModel:
            {"async " if asynchronous else ""}def execute(self, requests):
                return [helper([1.0]) for r in requests]
    """
    folder = write_model(tmp_path, "m", source)
    backend = load(folder)
    with pytest.raises(InferenceFailed) as caught:
        backend.execute_requests([request(1.0)])
    backend.close()
    path = folder / "1" / "model.py"
    frames = f"  {path}(5): helper\n  {path}(9): <listcomp>\n  {path}(9): execute\n"
    assert caught.value.message.startswith(FAILED + "TritonModelException: ")
    assert caught.value.message.endswith(f"\n\nAt:\n{frames}")
    assert "triton_python_backend_utils" not in caught.value.message


def test_async_execute_and_finalize_once(tmp_path):
    marker = tmp_path / "finalized"
    source = f"""
        import asyncio
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            async def execute(self, requests):
                await asyncio.sleep(0)
                return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", r.inputs()[0].as_numpy() * 2)])
                        for r in requests]

            def finalize(self):
                with open({str(marker)!r}, "a") as out:
                    out.write("done\\n")
    """
    backend = load(write_model(tmp_path, "m", source))
    (outputs,) = backend.execute_requests([request(2.0, outputs=("Y",))])
    np.testing.assert_array_equal(outputs[0].data, np.full((1, 4), 4.0, np.float32))
    backend.close()
    backend.close()
    assert marker.read_text() == "done\n"


def test_default_model_filename_is_honoured(tmp_path):
    config = CONFIG + 'default_model_filename: "entry.py"\n'
    folder = write_model(tmp_path, "m", ECHO, config=config, filename="entry.py")
    (outputs,) = load(folder).execute_requests([request(1.0)])
    assert [t.name for t in outputs] == ["Y", "Z"]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("import not_a_module_anywhere\n", "importing 'model.py' raised ModuleNotFoundError"),
        ("class Other:\n    pass\n", "defines no class TritonPythonModel"),
        ("class TritonPythonModel:\n    pass\n", "has no 'execute' method"),
        ("class TritonPythonModel:\n    def initialize(self, args):\n        raise ValueError('bad')\n"
         "    def execute(self, requests):\n        return []\n", "initialize() raised ValueError: bad"),
    ],
    ids=["import-error", "no-class", "no-execute", "initialize-raises"],
)  # fmt: skip
def test_a_model_that_cannot_load(tmp_path, source, message):
    with pytest.raises(ModelNotReady, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(write_model(tmp_path, "m", source))


def test_a_backend_module_that_does_not_import_is_unsupported(tmp_path, monkeypatch):
    """The python backend has no pip extra: the error says so instead of a KeyError."""
    folder = write_model(tmp_path, "m", "class TritonPythonModel:\n    pass\n")
    monkeypatch.setitem(sys.modules, "workers.backends.python", None)  # its import fails
    with pytest.raises(Unsupported) as caught:
        load(folder)
    assert caught.value.message.startswith("backend 'python' is not installed in this worker (import of ")
    assert caught.value.message.endswith("; it ships with naiad: reinstall naiad)")


def test_auto_complete_config_failure_makes_the_model_unavailable(tmp_path):
    source = """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                config.add_input({"name": "X", "data_type": "TYPE_INT8", "dims": [4]})
                return config

            def execute(self, requests):
                return []
    """
    write_model(tmp_path, "m", source)
    entry = index_repository(LocalStore(tmp_path))["m"]
    assert entry.state == "UNAVAILABLE"
    assert entry.reason == (
        "auto_complete_config of model 'm' failed: ValueError: unable to load model 'm', "
        "configuration expects datatype TYPE_FP32 for input 'X', model provides TYPE_INT8"
    )


#: An ``execute`` answering each request with the tensors ``{tensors}`` builds from ``x``.
RETURNS = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
                z = np.ones((len(x), 1), np.int32)
                out.append(pb_utils.InferenceResponse({tensors}))
            return out
"""


@pytest.mark.parametrize(("tensors", "names"), [('[pb_utils.Tensor("W", x), pb_utils.Tensor("Z", z)]', ["Z"]),
                                                ("[]", [])])  # fmt: skip
def test_a_request_naming_no_outputs_gets_the_declared_ones_given(tmp_path, tensors, names):
    """As from Triton (checked by tests/differential): its core asks for every declared
    output, the stub prunes to those, and what the model did not produce is left out."""
    backend = load(write_model(tmp_path, "m", RETURNS.replace("{tensors}", tensors)))
    (result,) = backend.execute_requests([request(1.0)])
    assert [t.name for t in result] == names


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ('[pb_utils.Tensor("W", x), pb_utils.Tensor("Z", z)]',
         "the response of model 'm' has no output 'Y' (requested); it has 'W', which the model "
         "configuration does not declare"),
        ("[]", "the response of model 'm' has no output 'Y', 'Z' (requested)"),
        ('[pb_utils.Tensor("Y", x.astype(np.int32)), pb_utils.Tensor("Z", z)]',
         "model 'm' returned a bad output: configuration expects datatype TYPE_FP32 for output 'Y', "
         "model provides TYPE_INT32"),
        ('[pb_utils.Tensor("Y", np.zeros((len(x), 5), np.float32)), pb_utils.Tensor("Z", z)]',
         "model 'm' returned a bad output: output 'Y' has shape [1, 5], its configuration expects "
         "[1, 4] (-1: any size)"),
        ('[pb_utils.Tensor("Y", np.concatenate([x, x])), pb_utils.Tensor("Z", z)]',
         "output 'Y' has shape [2, 4], its configuration expects [1, 4]"),
        ('[pb_utils.Tensor("Y", x[0]), pb_utils.Tensor("Z", z)]',
         "output 'Y' has shape [4], its configuration expects [1, 4]"),
    ],
    ids=["undeclared-name", "no-outputs", "wrong-datatype", "wrong-dims", "extra-rows", "no-batch-dim"],
)  # fmt: skip
def test_outputs_that_contradict_the_config_fail_their_request(tmp_path, tensors, message):
    backend = load(write_model(tmp_path, "m", RETURNS.replace("{tensors}", tensors)))
    (result,) = backend.execute_requests([request(1.0, outputs=("Y", "Z"))])
    assert isinstance(result, InferenceFailed) and result.status == HTTPStatus.INTERNAL_SERVER_ERROR
    assert message in result.message


def test_undeclared_and_unrequested_outputs_are_dropped(tmp_path):
    """As Triton's stub prunes a response to the requested outputs: an extra output, declared
    or not, is not sent and not checked."""
    tensors = '[pb_utils.Tensor("Z", z), pb_utils.Tensor("W", x), pb_utils.Tensor("Y", x[0])]'
    backend = load(write_model(tmp_path, "m", RETURNS.replace("{tensors}", tensors)))
    (only_z,) = backend.execute_requests([request(1.0, outputs=("Z",), rows=3)])
    assert [(t.name, t.shape) for t in only_z] == [("Z", [3, 1])]


def test_an_output_given_twice_goes_back_once(tmp_path):
    """The first tensor of a name is the output (the shortcut of ``_outputs`` must not send both)."""
    tensors = '[pb_utils.Tensor("Y", x), pb_utils.Tensor("Z", z), pb_utils.Tensor("Y", x + 1)]'
    backend = load(write_model(tmp_path, "m", RETURNS.replace("{tensors}", tensors)))
    for outputs in [("Y", "Z"), ()]:
        (result,) = backend.execute_requests([request(1.0, outputs=outputs)])
        assert [(t.name, float(t.data.flat[0])) for t in result] == [("Y", 1.0), ("Z", 1.0)], outputs


def test_what_execute_does_to_requested_output_names_changes_nothing(tmp_path):
    """``requested_output_names()`` is a new set each call (Triton 2.51's stub, asked of real
    Triton): a model adding to it still gets back only what the client asked for, in its order."""
    tensors = ('(r.requested_output_names().add("Z") or r.requested_output_names().clear() or '
               '[pb_utils.Tensor("Z", z), pb_utils.Tensor("Y", x)])')
    backend = load(write_model(tmp_path, "m", RETURNS.replace("{tensors}", tensors)))
    (only_y,) = backend.execute_requests([request(1.0, outputs=("Y",))])
    assert [t.name for t in only_y] == ["Y"]
    (both,) = backend.execute_requests([request(1.0, outputs=("Z", "Y"))])
    assert [t.name for t in both] == ["Z", "Y"]


def test_an_output_reshape_is_checked_on_the_model_side(tmp_path):
    """With ``reshape`` the model produces ``reshape.shape`` and the client gets ``dims``."""
    config = CONFIG.replace('dims: [ 4 ] }, {', 'dims: [ 4 ] reshape: { shape: [ 2, 2 ] } }, {')
    tensors = '[pb_utils.Tensor("Y", x.reshape(len(x), 2, 2)), pb_utils.Tensor("Z", z)]'
    backend = load(write_model(tmp_path, "m", RETURNS.replace("{tensors}", tensors), config=config))
    (outputs,) = backend.execute_requests([request(1.0, rows=2)])
    assert [(t.name, t.shape) for t in outputs] == [("Y", [2, 4]), ("Z", [2, 1])]
    flat = '[pb_utils.Tensor("Y", x), pb_utils.Tensor("Z", z)]'
    backend = load(write_model(tmp_path, "n", RETURNS.replace("{tensors}", flat), config=config))
    (error,) = backend.execute_requests([request(1.0, rows=2)])
    assert "output 'Y' has shape [2, 4], its configuration expects [2, 2, 2]" in error.message


@pytest.mark.parametrize(
    "dims", [[4], [2, 2], [-1], [2, -1], []], ids=["fixed", "2d", "any", "partly-any", "scalar"]
)  # fmt: skip
@pytest.mark.parametrize("rows", [None, 1, 3])
def test_an_output_that_fits_quickly_is_one_output_fault_accepts(dims, rows):
    """``OutputRule.fits`` (the common case's quick yes) never says yes where
    ``output_fault`` finds a fault, and says yes for an output of the config's own native
    dtype and fixed shape; the datatype then sent is the one the general path would name."""
    spec = mc.ModelOutput(name="Y", data_type=mc.TYPE_FP32, dims=dims)
    rule = OutputRule.of(spec)
    front = [] if rows is None else [rows]
    own = [d if d > 0 else 3 for d in dims]
    shapes = [front + own, front + [d + 1 for d in own], front + [4], front + [2, 2], front + [1, 4], front,
              [5, 4]]  # fmt: skip
    dtypes = [np.float32, np.dtype(">f4"), np.float64, np.int32, np.object_]
    for shape in shapes:
        for dtype in dtypes:
            array = np.zeros(shape, dtype=dtype)
            if rule.fits(array, rows):
                assert output_fault(rule, array, rows) is None, (shape, dtype)
                assert datatype_of(array.dtype) == rule.v2 == "FP32"
    fitting = np.zeros(front + own, np.float32)
    assert rule.fits(fitting, rows) == (-1 not in dims)
    assert output_fault(rule, fitting, rows) is None
    assert not OutputRule.of(mc.ModelOutput(name="S", data_type=mc.TYPE_STRING, dims=[1])).fits(
        np.array([[b"x"]], dtype=np.object_), None)  # BYTES: the general path decides


SENDS = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

    def answer(r, plus):
        x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
        z = np.ones((len(x), 1), np.int32)
        return pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + plus), pb_utils.Tensor("Z", z)])

    class TritonPythonModel:
        def execute(self, requests):
            {body}
"""


@pytest.mark.parametrize(
    "body",
    [
        "for r in requests: r.get_response_sender().send(answer(r, 1), flags=FINAL)",
        "for r in requests: s = r.get_response_sender(); s.send(answer(r, 1)); s.send(flags=FINAL)",
        "[r.get_response_sender().send(answer(r, 1), flags=FINAL) for r in requests]\n"
        "            return [answer(r, 5) for r in requests]  # the sent response is the request's",
        "requests[0].get_response_sender().send(answer(requests[0], 1), flags=FINAL)\n"
        "            return [answer(requests[0], 5), answer(requests[1], 1)]  # the second: from the list",
    ],
    ids=["send-final", "send-then-final", "sent-and-returned", "one-sent-one-returned"],
)  # fmt: skip
def test_a_request_answered_through_its_response_sender(tmp_path, body):
    """A model that is not decoupled may answer through ``get_response_sender()`` (Triton 2.51
    serves it: asked of it); what it sent is the request's answer, pruned as a returned one."""
    backend = load(write_model(tmp_path, "m", SENDS.replace("{body}", body)))
    first, second = backend.execute_requests([request(1.0, outputs=("Y",)), request(2.0)])
    assert [t.name for t in first] == ["Y"] and first[0].data.flat[0] == 2.0
    assert [t.name for t in second] == ["Y", "Z"] and second[0].data.flat[0] == 3.0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("r = requests[0]; s = r.get_response_sender(); s.send(answer(r, 1)); s.send(answer(r, 1))",
         "Unable to send response. Non-decoupled model cannot send more than one response."),
        ("requests[0].get_response_sender().send(flags=FINAL)",
         "Unable to send response. Non-decoupled model cannot send complete final before sending a "
         "response."),
        ("r = requests[0]; s = r.get_response_sender(); s.send(answer(r, 1), FINAL); s.send(flags=FINAL)",
         "Unable to send response. Response sender has been closed."),
        ("pb_utils.InferenceRequest(model_name='m', inputs=[], requested_output_names=[])"
         ".get_response_sender().send(flags=FINAL)",
         "Unable to send response. Response sender has no reference to the decoupled state of the model."),
    ],
    ids=["twice", "final-first", "after-final", "bls-request"],
)  # fmt: skip
def test_a_send_that_python_backend_refuses_fails_the_batch_with_its_message(tmp_path, body, message):
    backend = load(write_model(tmp_path, "m", SENDS.replace("{body}", body)))
    with pytest.raises(InferenceFailed) as caught:
        backend.execute_requests([request(1.0), request(2.0)])
    assert caught.value.message.startswith(FAILED + f"TritonModelException: {message}")


def test_a_request_neither_sent_nor_returned_fails_alone(tmp_path):
    """The request that was sent its response keeps it; the other one fails (500)."""
    body = "requests[0].get_response_sender().send(answer(requests[0], 1), flags=FINAL)"
    backend = load(write_model(tmp_path, "m", SENDS.replace("{body}", body)))
    sent, unanswered = backend.execute_requests([request(1.0), request(2.0)])
    assert [t.name for t in sent] == ["Y", "Z"] and sent[0].data.flat[0] == 2.0
    assert isinstance(unanswered, NaiadError) and unanswered.status == HTTPStatus.INTERNAL_SERVER_ERROR
    expected = "no response was sent or returned for request 1 of 2 (request id '')"
    assert unanswered.message == FAILED + expected


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("requests[0].get_response_sender().send()",
         "Inference Response object must be provided when the response flags is set to zero."),
        ("requests[0].get_response_sender().send(answer(requests[0], 1), flags=7)",
         "Unable to send response. Unsupported flag provided."),
    ],
    ids=["nothing", "unknown-flag"],
)  # fmt: skip
def test_a_send_with_bad_arguments_is_refused_with_python_backends_message(tmp_path, body, message):
    backend = load(write_model(tmp_path, "m", SENDS.replace("{body}", body)))
    with pytest.raises(InferenceFailed) as caught:
        backend.execute_requests([request(1.0)])
    assert caught.value.message.startswith(FAILED + f"TritonModelException: {message}")


@pytest.mark.parametrize("raised", ["SystemExit(3)", "KeyboardInterrupt()"])
def test_system_exit_from_execute_fails_the_batch_not_the_worker(tmp_path, raised):
    """As Triton's stub reports it ("... message: SystemExit: 3"); the backend serves on."""
    source = f"""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                if requests[0].inputs()[0].as_numpy().flat[0] < 0:
                    raise {raised}
                return [pb_utils.InferenceResponse([]) for r in requests]
    """
    backend = load(write_model(tmp_path, "m", source))
    with pytest.raises(InferenceFailed) as caught:
        backend.execute_requests([request(-1.0)])
    assert caught.value.message.startswith(FAILED + raised.split("(")[0])
    assert backend.execute_requests([request(1.0)]) != []  # still serving
