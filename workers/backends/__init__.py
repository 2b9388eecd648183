"""Model backends. Each exposes ``load(version_dir, config, device) -> Backend``.

A backend's ``infer(inputs, outputs)`` takes model-facing arrays (after ``reshape``) by input
name and returns arrays by output name. Backends are imported only by the worker that needs
them, so no process imports a framework it does not use.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import ModelNotReady, NaiadError, Unsupported
from repository_store import backend_of


class Backend(Protocol):
    """What the worker runs. Two optional methods, looked up with ``getattr``:

    - ``execute_requests(requests: list[InferRequest]) -> list[list[Tensor] | NaiadError]``:
      a request-level backend (Triton's Python backend) takes the requests of a dynamic batch
      as they are, unmerged, and answers each (its outputs, or the error that fails it); the
      worker then calls it instead of merge / ``infer`` / split.
    - ``close() -> None``: called once when the worker exits (the Python backend's
      ``finalize``).
    """

    def infer(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """Run one batch. Raises any exception the framework raises."""
        ...


logger = logging.getLogger(__name__)

_MODULES = {
    "onnxruntime": "workers.backends.onnxruntime",
    "pytorch": "workers.backends.pytorch",
    "tensorflow": "workers.backends.tensorflow",
    "python": "workers.backends.python",
}
# The pip extra that installs each backend's framework.
_EXTRAS = {"onnxruntime": "onnx", "pytorch": "pytorch", "tensorflow": "tensorflow"}


def load_backend(version_dir: Path, config: mc.ModelConfig, device: str) -> Backend:
    """Load the model in ``version_dir`` with the backend its config names.

    ``device`` is ``"cpu"`` or ``"cuda"``.
    :raises Unsupported: a backend this build does not have, or whose framework is not installed.
    :raises ModelNotReady: the model does not load: the framework's error, or a model whose
        tensors disagree with its config (Triton marks such a model UNAVAILABLE).
    """
    name = backend_of(config)
    if name not in _MODULES:
        raise Unsupported(f"backend '{name}' is not available in this worker")
    try:
        module = importlib.import_module(_MODULES[name])
    except ImportError as exc:
        raise Unsupported(f"backend '{name}' is not installed in this worker ({exc}; "
                          f"{_install_hint(name)})") from None  # fmt: skip
    try:
        return module.load(version_dir, config, device)
    except NaiadError:
        raise
    except Exception as exc:  # the framework's own errors, whatever their class
        raise ModelNotReady(f"unable to load model '{config.name}' version {version_dir.name} "
                            f"({name}): {exc}") from exc  # fmt: skip


def framework_missing(name: str) -> bool:
    """True when ``name`` is a backend of this build whose module does not import here (its
    framework is not installed: a gateway-only image); False for one that imports, and for
    a name this build has no backend for (loading that fails with :class:`Unsupported`)."""
    if name not in _MODULES:
        return False
    try:
        importlib.import_module(_MODULES[name])
    except ImportError:
        return True
    return False


def _install_hint(name: str) -> str:
    """How to install backend ``name``: its pip extra, or naiad itself for a backend that
    needs no framework (``python``)."""
    extra = _EXTRAS.get(name)
    return f"pip install 'naiad[{extra}]'" if extra else "it ships with naiad: reinstall naiad"


def prepare(names: Sequence[str] = ("onnxruntime",)) -> list[str]:
    """Import the backends ``names`` and let each warm up (a warm-pool process does this
    before it knows its model, so a claim pays only the model load). Only ONNX Runtime by
    default: importing torch (~1 s, ~220 MB) and TensorFlow (~4 s, ~600 MB) into every pool
    process would cost more than most claims save (``Settings.warm_pool_backends``). Returns
    the names of the backends ready; an unknown one, or one whose framework is not installed,
    is skipped."""
    ready = []
    for name, module_name in ((n, _MODULES[n]) for n in names if n in _MODULES):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        try:
            getattr(module, "warm_up", lambda: None)()
        except Exception:  # the model's own load will report a real problem
            logger.warning("backend '%s' did not warm up", name, exc_info=True)
        ready.append(name)
    return ready
