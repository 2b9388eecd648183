"""Load checks: a model's files tried with its backend before anyone relies on them.

- ``naiad deploy --load-check`` (:func:`load_check`): load one model version and run it
  once. The inputs are zeros of the configured shapes (a batch of 1 when the model batches;
  each variable ``-1`` dimension as 1; empty strings for ``TYPE_STRING``), so a model whose
  file does not load, or does not accept the shapes its config declares, fails before it is
  uploaded rather than at its first cold start.
- An explicit model load (``POST /v2/repository/models/<m>/load``, gRPC
  ``RepositoryModelLoad``): the gateway, which never imports a framework, runs
  ``python -m workers.load_check`` (:func:`main`) in a child process
  (:mod:`gateway.load_probe`), which loads every served version of the registry entry as a
  worker would (pulled into the machine's model cache, loaded on the CPU, ``model_warmup``
  run, then closed: a Python model's ``initialize`` and ``finalize``), as Triton's
  load_model loads the model before it answers. No inference beyond the warmup runs.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.datatypes import config_to_datatype, numpy_dtype
from naiad.errors import NaiadError
from naiad.registry import ModelEntry
from naiad.settings import Settings
from repository_store import backend_of
from workers.backends import framework_missing, load_backend
from workers.load_failure import is_model_fault
from workers.loader import VersionLoader
from workers.model import ModelRunner


def zeros_for(config: mc.ModelConfig) -> dict[str, np.ndarray]:
    """Zero inputs of ``config``'s shapes (client-facing: ``dims``, batch of 1 in front)."""
    inputs = {}
    for spec in config.input:
        shape = ([1] if config.max_batch_size > 0 else []) + [1 if d == -1 else d for d in spec.dims]
        datatype = config_to_datatype(mc.DataType.Name(spec.data_type))
        if datatype == "BYTES":
            inputs[spec.name] = np.full(shape, b"", dtype=np.object_)
        else:
            inputs[spec.name] = np.zeros(shape, numpy_dtype(datatype))
    return inputs


def load_check(version_dir: Path, config: mc.ModelConfig) -> None:
    """Load ``version_dir`` on the CPU and run it once; raises what the backend raises."""
    runner = ModelRunner(config, load_backend(version_dir, config, "cpu"))
    runner.run(zeros_for(config), [], 1)


def check_entry(entry: ModelEntry, settings: Settings) -> str | None:
    """Load every version of registry ``entry`` (READY, not an ensemble) as a worker would,
    on the CPU, then close them. Returns None when they loaded, or why nothing was tried
    (the backend's framework is not installed in this environment). Raises what the load
    raises (:class:`NaiadError` subclasses, see :func:`workers.backends.load_backend`)."""
    assert entry.config is not None
    backend = backend_of(entry.config)
    if framework_missing(backend):
        return f"backend '{backend}' is not installed here"
    loader = VersionLoader(settings, entry.name)

    async def load_all() -> None:
        await loader.start(entry)
        for version in entry.versions:
            await loader.get(version)

    try:
        asyncio.run(load_all())
    finally:
        loader.close()
    return None


def main() -> int:
    """``python -m workers.load_check``: stdin holds JSON ``{"entry": base64 of the
    registry entry bytes, "repository": URI, "cache_dir": path, "cache_max_bytes": int}``;
    the one JSON line written to the original stdout is ``{"loaded": true}``,
    ``{"skipped": why}`` or ``{"error": message, "fault": bool}`` (``fault``: the error lies
    in the model, :func:`workers.load_failure.is_model_fault`). Whatever the model prints
    goes to stderr. Exit 0 when loaded or skipped, else 1."""
    result = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    request = json.loads(sys.stdin.read())
    entry = ModelEntry.from_bytes(base64.b64decode(request["entry"]))
    settings = Settings(model_repository=request["repository"], cache_dir=Path(request["cache_dir"]),
                        cache_max_bytes=request["cache_max_bytes"], device="cpu")  # fmt: skip
    try:
        skipped = check_entry(entry, settings)
    except NaiadError as exc:
        answer: dict = {"error": exc.message, "fault": is_model_fault(exc)}
    except Exception as exc:  # the framework's own errors, whatever their class
        answer = {"error": f"failed to load model '{entry.name}': {type(exc).__name__}: {exc}", "fault": True}
    else:
        answer = {"skipped": skipped} if skipped else {"loaded": True}
    result.write(json.dumps(answer) + "\n")
    result.close()
    return 1 if "error" in answer else 0


if __name__ == "__main__":
    sys.exit(main())
