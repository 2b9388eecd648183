"""``workers.backends.prepare``: what a warm-pool process imports before its claim. By default
only ONNX Runtime: torch and TensorFlow stay out of every pool process unless asked for."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, sys
from workers import backends
ready = backends.prepare(*[json.loads(a) for a in sys.argv[1:]])
print(json.dumps([ready, "torch" in sys.modules, "tensorflow" in sys.modules]))
"""


def prepare(*args: list[str]) -> list:
    done = subprocess.run([sys.executable, "-c", SCRIPT, *map(json.dumps, args)],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def test_default_prepares_onnxruntime_only() -> None:
    assert prepare() == [["onnxruntime"], False, False]


def test_named_backends_are_prepared_and_unknown_ones_skipped() -> None:
    assert prepare(["pytorch", "no_such_backend"]) == [["pytorch"], True, False]


def test_a_prepared_torch_keeps_the_default_thread_pools() -> None:
    """A pool process warms torch up before its claim; torch then refuses to resize its
    inter-op pool, so the warm-up sizes it first: the claimed model gets one inter-op thread
    (the backend's default, as a bare worker's) and intra-op threads for every usable CPU."""
    script = (
        "import json, os, torch\n"
        "from workers import backends\n"
        "from workers.backends import pytorch\n"
        "from tritonclient.grpc import model_config_pb2 as mc\n"
        "backends.prepare(['pytorch'])\n"
        "pytorch.configure_threads(mc.ModelConfig(name='m'))\n"
        "print(json.dumps([torch.get_num_interop_threads(), torch.get_num_threads(),"
        " len(os.sched_getaffinity(0))]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          check=True)  # fmt: skip
    interop, intra, usable = json.loads(done.stdout.splitlines()[-1])
    assert (interop, intra) == (1, usable)
