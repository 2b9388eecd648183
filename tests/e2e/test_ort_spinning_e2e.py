"""A ``model.py`` that builds its ONNX Runtime session without a word on spinning, served by
``naiad serve``: the session it gets does not spin (``session.intra_op.allow_spinning`` "0",
``workers.ort_spinning``); with ``--onnxruntime-spinning true`` the key stays unset (ONNX
Runtime's own default, spinning). The model reports what its session holds as an output."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from naiad_harness import python_model

CONFIG = """name: "ortcfg"
backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "spinning" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# onnxruntime is imported in initialize. A warm-pool process (the default: ONNX Runtime's pool)
# imported it before its claim, so its class is patched at once; without a pool
# (--warm-pool-size 0) it is imported after the worker installed its default: the import hook.
MODEL = '''
from pathlib import Path

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import onnxruntime as ort
        from onnx import TensorProto, helper, save

        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])])
        path = Path(args["model_repository"]) / "identity.onnx"
        save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        try:
            self.spinning = self.session.get_session_options().get_session_config_entry(
                "session.intra_op.allow_spinning")
        except RuntimeError:
            self.spinning = "unset"

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = self.session.run(None, {"x": x})[0]
            flag = np.array([[self.spinning.encode()]] * len(x), dtype=object)
            tensors = [pb_utils.Tensor("y", y), pb_utils.Tensor("spinning", flag)]
            out.append(pb_utils.InferenceResponse(tensors))
        return out
'''


def repository(folder):
    return python_model(folder, "ortcfg", CONFIG, MODEL)


@pytest.mark.parametrize(("extra", "expected"), [
    ([], b"0"), (["--warm-pool-size", "0"], b"0"), (["--onnxruntime-spinning", "true"], b"unset"),
    (["--warm-pool-size", "0", "--onnxruntime-spinning", "true"], b"unset")])
def test_a_python_models_onnxruntime_session_does_not_spin(naiad_server, tmp_path, extra, expected):
    server = naiad_server(repository(tmp_path / "repo"), extra_args=extra)
    client = httpclient.InferenceServerClient(server.url)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("ortcfg", [inp])
    np.testing.assert_array_equal(result.as_numpy("y"), x)
    assert result.as_numpy("spinning").reshape(-1).tolist() == [expected, expected]
