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


def test_what_is_not_session_options_is_onnx_runtimes_to_judge():
    # options of another type (a providers list in their place), or a falsy value: what ONNX
    # Runtime makes of it without the patch (its own error; its defaults)
    bad = CHECK + """
for bad in (["CPUExecutionProvider"], "options", 0, None):
    for providers in (None, ["CPUExecutionProvider"]):
        try:
            ort.InferenceSession(model, bad, providers)
            print("built")
        except Exception as exc:
            print(type(exc).__name__)
"""
    assert run(INSTALL + bad)[4:] == run(bad)[4:]


def test_a_fresh_copy_of_the_module_is_patched_too():
    source = "import onnxruntime\n" + INSTALL + """
import importlib, sys
from workers.ort_spinning import SESSION_MODULE, _PATCHED
del sys.modules[SESSION_MODULE]
module = importlib.import_module(SESSION_MODULE)
print(getattr(module.InferenceSession.__init__, _PATCHED, False), hasattr(module.__loader__, "get_source"))
"""
    assert run(source) == ["True", "True"]
