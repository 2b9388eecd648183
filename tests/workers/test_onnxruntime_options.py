"""``workers.backends.onnxruntime.session_options``: Triton's thread-count parameters, and idle
intra-op threads that do not spin unless the model asks (docs/architecture.md); a CPU
session run through its binding (``direct_run``)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from repository_store.config import parse_config
from workers.backends.onnxruntime import SPINNING, session_options


def config(parameters: dict[str, str]):
    text = 'name: "m" backend: "onnxruntime" max_batch_size: 0\n' + "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in parameters.items()
    )
    return parse_config(text, "m")


def test_by_default_threads_are_onnx_runtimes_choice_and_do_not_spin():
    options = session_options(config({}))
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (0, 0)
    assert options.get_session_config_entry(SPINNING) == "0"
    assert session_options().get_session_config_entry(SPINNING) == "0"  # no config: the same


def test_tritons_thread_count_parameters_and_spinning_are_read():
    options = session_options(config({"intra_op_thread_count": "3", "inter_op_thread_count": " 2 ",
                                      SPINNING: "1"}))  # fmt: skip
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (3, 2)
    assert options.get_session_config_entry(SPINNING) == "1"


BAD = [("intra_op_thread_count", "-1"), ("inter_op_thread_count", "two"),
       ("intra_op_thread_count", "\u00b2"),  # isdigit(), yet not int()
       ("intra_op_thread_count", "99999999999"), (SPINNING, "yes")]


@pytest.mark.parametrize(("key", "value"), BAD)
def test_a_bad_value_is_logged_and_the_default_kept(key, value, caplog):
    with caplog.at_level(logging.WARNING, logger="workers.backends.onnxruntime"):
        options = session_options(config({key: value}))
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (0, 0)
    assert options.get_session_config_entry(SPINNING) == "0"
    assert f"ignoring {key}" in caplog.text


def test_an_input_the_graph_refuses_is_the_requests_fault(tmp_path):
    """ONNX Runtime's INVALID_ARGUMENT (a shape the config's -1 let through) is InvalidInput:
    HTTP 400 / gRPC INVALID_ARGUMENT, as Triton's ONNX Runtime backend answers, not a 500."""
    from naiad.errors import InvalidInput  # noqa: PLC0415
    from workers.backends.onnxruntime import OnnxRuntimeBackend  # noqa: PLC0415

    save_model(tmp_path / "m.onnx", "Gemm", [1.0, 0.0, 0.0, 1.0])
    backend = OnnxRuntimeBackend(tmp_path / "m.onnx", "cpu")
    assert backend.infer({"x": np.ones((1, 2), np.float32)}, [])["y"].tolist() == [[1.0, 1.0]]
    with pytest.raises(InvalidInput, match="inference failed: .*INVALID_ARGUMENT"):
        backend.infer({"x": np.ones((1, 3), np.float32)}, [])


def test_a_cpu_session_runs_through_its_binding_and_answers_as_session_run(tmp_path, monkeypatch):
    """``direct_run``: on the CPU provider the binding's own ``run`` is called (no Python
    wrapper checks), with the same outputs as ``InferenceSession.run``; a session on another
    provider keeps the wrapper (its provider fall-back)."""
    from workers.backends import onnxruntime as backend_module  # noqa: PLC0415

    path = tmp_path / "m.onnx"
    save_model(path, "MatMul", [1.0, 2.0, 3.0, 4.0])
    backend = backend_module.OnnxRuntimeBackend(path, "cpu")
    assert backend._run is not None
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    wrapped = backend.session.run(["y"], {"x": x})[0]
    np.testing.assert_array_equal(backend.infer({"x": x}, ["y"])["y"], wrapped)
    calls = []
    monkeypatch.setattr(backend.session, "run", lambda *a: calls.append(a))
    backend.infer({"x": x}, ["y"])
    assert calls == []  # the wrapper was not called
    gpu = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(backend.session, "get_providers", lambda: gpu)
    assert backend_module.direct_run(backend.session) is None


def save_model(path, op: str, weights: list[float]) -> None:
    """A one-node ``op`` graph: y = op(x, w), x FP32 [-1, 2], w FP32 [2, 2] = ``weights``."""
    from onnx import TensorProto, helper, save  # noqa: PLC0415

    graph = helper.make_graph(
        [helper.make_node(op, ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor("w", TensorProto.FLOAT, [2, 2], weights)],
    )  # fmt: skip
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)


def test_a_left_out_optional_input_fails_as_session_run_says_it(tmp_path):
    """A config may mark an input ``optional`` that the graph needs: a request without it
    reaches the backend. The binding's run does not check for it (a kernel fails, its message
    a source line of ONNX Runtime's); the backend answers as ``InferenceSession.run`` did:
    a ValueError naming the missing input (500, "inference failed: Required inputs ...")."""
    from onnx import TensorProto, helper, save  # noqa: PLC0415

    from workers.backends.onnxruntime import OnnxRuntimeBackend  # noqa: PLC0415

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 2]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    save(model, tmp_path / "m.onnx")
    backend = OnnxRuntimeBackend(tmp_path / "m.onnx", "cpu")
    assert backend._run is not None
    a = np.ones((1, 2), np.float32)
    with pytest.raises(ValueError) as wrapper:
        backend.session.run(["y"], {"a": a})
    with pytest.raises(ValueError) as ours:
        backend.infer({"a": a}, [])
    assert str(ours.value) == str(wrapper.value)
    assert str(ours.value) == "Required inputs (['b']) are missing from input feed (['a'])."
    assert backend.infer({"a": a, "b": a}, [])["y"].tolist() == [[2.0, 2.0]]
