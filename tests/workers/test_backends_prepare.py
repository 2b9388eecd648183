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
