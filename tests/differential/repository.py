"""The one repository both servers serve: Python-backend ``model.py`` models and an ensemble.

Real Triton here has only its Python backend (the ``nvidia-pytriton`` wheel), so every model
is a ``model.py``; each one runs unchanged on Triton and on Naiad. What each model covers:

- ``identity``: every datatype but BF16 (numpy has none, so Triton's Python backend cannot
  hold it), optional inputs ``IN_<DT>`` copied to ``OUT_<DT>``, batching (``max_batch_size`` 8);
- ``fixed``: no batching, fixed dims, BYTES;
- ``add_sub``: no batching, labels on ``OUTPUT0`` (classification);
- ``versioned`` (``all``), ``versioned_latest`` (``latest 2``), ``versioned_specific``
  (``specific [1, 3]``), ``versioned_default`` (no policy: latest 1): versions 1-3, ``OUT =
  IN + version``;
- ``batcher``: ``dynamic_batching`` with preferred sizes 4 and 8; ``ROWS`` is the batch size
  the model ran (its rows);
- ``cached``: ``response_cache``; ``COUNT`` counts the executions of this instance, so an
  answer from the cache repeats an old count;
- ``failing``: ``CODE`` picks a ``TritonError`` code per request, 99 raises in ``execute``;
- ``ens``: an ensemble of two ``add_sub`` steps;
- ``args``, ``args_default`` (no instance group): answer ``initialize``'s ``args`` and the
  ``model_config`` they hold;
- ``asked``: ``ASKED`` is what ``requested_output_names()`` is (its type) and holds after the
  model added to the first answer it got; ``PARAMS`` the text of ``request.parameters()``;
- ``objects``: BYTES outputs from arrays that are not of ``bytes``: ``OUTS`` from an object
  array of ``1, 1.5, None, "a", b"b", np.str_("é"), [1, 2], "hé", np.bytes_(b"c")`` (Triton
  takes an element of type ``bytes`` as it is and sends any other as ``str(element)`` in
  UTF-8: ``np.bytes_(b"c")`` is ``"b'c'"``), ``OUTS_S`` from a byte-string (``S``) array.
  (``tritonserver`` runs in its own folder, not the project's root: its stub puts the working
  directory first on ``sys.path`` and would import Naiad's ``triton_python_backend_utils``.)
- ``sent``: answers through ``get_response_sender()`` (not decoupled); ``IN`` picks how: 0 one
  ``send`` with the final flag, 1 the response then the final flag alone, 2 as 0 and also a
  returned list (``OUT = IN + 10`` sent, ``IN + 20`` returned).
"""

from __future__ import annotations

import pathlib
import textwrap

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES"]  # fmt: skip
LABELS = ["zero", "one", "two", "three"]
VERSIONS = (1, 2, 3)


def _type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


IDENTITY_CONFIG = "\n".join(
    ['backend: "python"', "max_batch_size: 8", "input ["]
    + [f'  {{ name: "IN_{dt}" data_type: {_type(dt)} dims: [ -1 ] optional: true }},' for dt in DATATYPES]
    + ["]", "output ["]
    + [f'  {{ name: "OUT_{dt}" data_type: {_type(dt)} dims: [ -1 ] }},' for dt in DATATYPES]
    + ["]"]
).replace("},\n]", "}\n]")

IDENTITY_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for tensor in request.inputs():
                name = "OUT_" + tensor.name()[3:]
                outputs.append(pb_utils.Tensor(name, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

FIXED_CONFIG = """
backend: "python"
max_batch_size: 0
input [
  { name: "IN_FP32" data_type: TYPE_FP32 dims: [ 2, 3 ] },
  { name: "IN_BYTES" data_type: TYPE_STRING dims: [ 2 ] }
]
output [
  { name: "OUT_FP32" data_type: TYPE_FP32 dims: [ 2, 3 ] },
  { name: "OUT_BYTES" data_type: TYPE_STRING dims: [ 2 ] }
]
"""

ADD_SUB_CONFIG = """
backend: "python"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

ADD_SUB_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.int32)),
            ]))
        return responses
"""

VERSIONED_CONFIG = """
backend: "python"
max_batch_size: 4
{policy}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""

VERSIONED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.version = float(args["model_version"])

    def plus(self, request):
        data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        return (data + self.version).astype(np.float32)

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", self.plus(r))])
            for r in requests
        ]
"""

POLICIES = {
    "versioned": "version_policy: { all { } }",
    "versioned_latest": "version_policy: { latest { num_versions: 2 } }",
    "versioned_specific": "version_policy: { specific { versions: [ 1, 3 ] } }",
    "versioned_default": "",
}

BATCHER_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: %d
}
"""
#: Long enough that six concurrent requests all arrive within it on a loaded machine.
BATCHER_DELAY_US = 1_500_000

BATCHER_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() for r in requests]
        rows = sum(a.shape[0] for a in arrays)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("ROWS", np.full((a.shape[0], 1), rows, np.int32))])
            for a in arrays
        ]
"""

CACHED_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [
  { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "COUNT" data_type: TYPE_INT64 dims: [ 1 ] }
]
response_cache { enable: true }
"""

CACHED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.count = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.count += 1
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", (data * 2).astype(np.float32)),
                pb_utils.Tensor("COUNT", np.array([self.count], np.int64)),
            ]))
        return responses
"""

FAILING_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "CODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

#: CODE -> the TritonError code the model answers with; 0: success, 99: execute raises.
FAILING_PY = """
import triton_python_backend_utils as pb_utils

# Looked up in execute: at import time Triton 2.51's stub gives these as plain ints, which
# its TritonError constructor refuses.
CODES = {2: "INTERNAL", 3: "NOT_FOUND", 4: "INVALID_ARG", 5: "UNAVAILABLE", 6: "UNSUPPORTED",
         7: "ALREADY_EXISTS", 8: "UNKNOWN"}

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            code_tensor = pb_utils.get_input_tensor_by_name(request, "CODE")
            code = int(code_tensor.as_numpy()[0])
            if code == 99:
                raise RuntimeError("execute raised")
            if code == 0:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", code_tensor.as_numpy())]))
            elif code == 1:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("failed: no code")))
            else:
                kind = getattr(pb_utils.TritonError, CODES[code])
                error = pb_utils.TritonError(f"failed with code {code}", kind)
                responses.append(pb_utils.InferenceResponse(error=error))
        return responses
"""

ARGS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "ARGS" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "CONFIG" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

#: ``initialize``'s ``args`` (but the repository path, which differs) and its model_config.
ARGS_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        skip = ("model_repository", "model_config")
        self.args = sorted(f"{k}={v}" for k, v in args.items() if k not in skip)
        self.config = json.dumps(json.loads(args["model_config"]), sort_keys=True)

    def execute(self, requests):
        args = np.array([a.encode() for a in self.args], dtype=np.object_)
        config = np.array([self.config.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", args), pb_utils.Tensor("CONFIG", config)])
                for _ in requests]
"""

ASKED_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [
  { name: "ASKED" data_type: TYPE_STRING dims: [ 2 ] },
  { name: "OTHER" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

ASKED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            first = request.requested_output_names()
            getattr(first, "add", getattr(first, "append", None))("OTHER")
            seen = [type(first).__name__, ",".join(sorted(request.requested_output_names()))]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("ASKED", np.array([s.encode() for s in seen], dtype=np.object_)),
                pb_utils.Tensor("OTHER", np.array([1.0], dtype=np.float32)),
                pb_utils.Tensor("PARAMS", np.array([request.parameters().encode()], dtype=np.object_)),
            ]))
        return responses
"""

OBJECTS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [
  { name: "OUTS" data_type: TYPE_STRING dims: [ 9 ] },
  { name: "OUTS_S" data_type: TYPE_STRING dims: [ 2 ] }
]
"""

OBJECTS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

ITEMS = [1, 1.5, None, "a", b"b", np.str_("\\u00e9"), [1, 2], "h\\u00e9", np.bytes_(b"c")]

class TritonPythonModel:
    def execute(self, requests):
        outs = np.empty(len(ITEMS), dtype=np.object_)
        for i, item in enumerate(ITEMS):
            outs[i] = item  # one by one: the list stays one element
        strings = np.array([b"x", b"yz"], dtype="S2")
        tensors = [pb_utils.Tensor("OUTS", outs), pb_utils.Tensor("OUTS_S", strings)]
        return [pb_utils.InferenceResponse(tensors) for _ in requests]
"""

SENT_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

SENT_PY = """
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

def answer(request, plus):
    x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + plus)])

class TritonPythonModel:
    def execute(self, requests):
        returned = None
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            if mode == 1:
                sender.send(answer(request, 10))
                sender.send(flags=FINAL)
            else:
                sender.send(answer(request, 10), flags=FINAL)
            if mode == 2:
                returned = [answer(r, 20) for r in requests]
        return returned
"""

ENSEMBLE_CONFIG = """
platform: "ensemble"
max_batch_size: 0
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "FINAL" data_type: TYPE_FP32 dims: [ 4 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "add_sub"
      model_version: -1
      input_map { key: "INPUT0" value: "A" }
      input_map { key: "INPUT1" value: "B" }
      output_map { key: "OUTPUT0" value: "SUM" }
    },
    {
      model_name: "add_sub"
      model_version: -1
      input_map { key: "INPUT0" value: "SUM" }
      input_map { key: "INPUT1" value: "A" }
      output_map { key: "OUTPUT0" value: "FINAL" }
    }
  ]
}
"""


def _model(root: pathlib.Path, name: str, config: str, code: str | None, versions=(1,)) -> pathlib.Path:
    folder = root / name
    for version in versions:
        (folder / str(version)).mkdir(parents=True)
        if code is not None:
            (folder / str(version) / "model.py").write_text(textwrap.dedent(code).lstrip())
    (folder / "config.pbtxt").write_text(config.strip() + "\n")
    return folder


def build_repository(root: pathlib.Path) -> pathlib.Path:
    """Write the repository under ``root`` (created) and return it."""
    root.mkdir(parents=True)
    _model(root, "identity", IDENTITY_CONFIG, IDENTITY_PY)
    _model(root, "fixed", FIXED_CONFIG, IDENTITY_PY)
    labels = _model(root, "add_sub", ADD_SUB_CONFIG, ADD_SUB_PY)
    (labels / "labels.txt").write_text("\n".join(LABELS) + "\n")
    for name, policy in POLICIES.items():
        _model(root, name, VERSIONED_CONFIG.format(policy=policy), VERSIONED_PY, VERSIONS)
    _model(root, "batcher", BATCHER_CONFIG % BATCHER_DELAY_US, BATCHER_PY)
    _model(root, "cached", CACHED_CONFIG, CACHED_PY)
    _model(root, "failing", FAILING_CONFIG, FAILING_PY)
    _model(root, "ens", ENSEMBLE_CONFIG, None)
    _model(root, "asked", ASKED_CONFIG, ASKED_PY)
    _model(root, "objects", OBJECTS_CONFIG, OBJECTS_PY)
    _model(root, "sent", SENT_CONFIG, SENT_PY)
    _model(root, "args", ARGS_CONFIG, ARGS_PY)
    _model(
        root,
        "args_default",
        ARGS_CONFIG.replace("instance_group [ { count: 1 kind: KIND_CPU } ]", ""),
        ARGS_PY,
    )
    return root
