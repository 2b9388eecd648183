"""Model backends. Each exposes ``load(version_dir, config, device) -> Backend``.

A backend's ``infer(inputs, outputs)`` takes model-facing arrays (after ``reshape``) by input
name and returns arrays by output name. Backends are imported only by the worker that needs
them, so no process imports a framework it does not use.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import Unsupported
from repository_store import backend_of


class Backend(Protocol):
    def infer(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """Run one batch. Raises any exception the framework raises."""
        ...


logger = logging.getLogger(__name__)

_MODULES = {"onnxruntime": "workers.backends.onnxruntime"}


def load_backend(version_dir: Path, config: mc.ModelConfig, device: str) -> Backend:
    """Load the model in ``version_dir`` with the backend its config names.

    ``device`` is ``"cpu"`` or ``"cuda"``. Raises :class:`Unsupported` for a backend this
    build does not have.
    """
    name = backend_of(config)
    if name not in _MODULES:
        raise Unsupported(f"backend '{name}' is not available in this worker")
    module = importlib.import_module(_MODULES[name])
    return module.load(version_dir, config, device)


def prepare() -> list[str]:
    """Import every backend this build has and let each warm up (a warm-pool process does
    this before it knows its model, so a claim pays only the model load). Returns the names
    of the backends ready; one whose framework is not installed is skipped."""
    ready = []
    for name, module_name in _MODULES.items():
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
