"""``workers.ort_spinning``: ONNX Runtime sessions built without a word on spinning get
``session.intra_op.allow_spinning`` "0"; options that set it are left as asked. Each case runs
in a fresh interpreter: the default is process-wide, and this test process's sessions must
keep ONNX Runtime's own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHECK = """
import onnxruntime as ort
from onnx import TensorProto, helper

graph = helper.make_graph(
    [helper.make_node("Identity", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def entry(session):
    try:
        return session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
    except RuntimeError:
        return "unset"


asked = ort.SessionOptions()
asked.add_session_config_entry("session.intra_op.allow_spinning", "1")
plain = ort.SessionOptions()
plain.intra_op_num_threads = 2
print(entry(ort.InferenceSession(model, providers=["CPUExecutionProvider"])),
      entry(ort.InferenceSession(model, plain, providers=["CPUExecutionProvider"])),
      entry(ort.InferenceSession(model, sess_options=asked, providers=["CPUExecutionProvider"])),
      plain.intra_op_num_threads)
"""

INSTALL = "from workers import ort_spinning\nort_spinning.install()\nort_spinning.install()\n"


def run(source: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(source)], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    return done.stdout.split()


@pytest.mark.parametrize("order", ["installed before the import", "installed after the import"])
def test_sessions_without_a_word_on_spinning_do_not_spin(order):
    source = INSTALL + CHECK if order.startswith("installed before") else (
        "import onnxruntime\n" + INSTALL + CHECK)
    # no options, options without the key, options asking to spin (kept); other options kept
    assert run(source) == ["0", "0", "1", "2"]


def test_without_install_onnxruntime_keeps_its_default():
    assert run(CHECK) == ["unset", "unset", "1", "2"]
