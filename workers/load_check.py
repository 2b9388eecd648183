"""``naiad deploy --load-check``: load one model version with its backend and run it once.

The inputs are zeros of the configured shapes (a batch of 1 when the model batches; each
variable ``-1`` dimension as 1; empty strings for ``TYPE_STRING``), so a model whose file
does not load, or does not accept the shapes its config declares, fails before it is
uploaded rather than at its first cold start.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.datatypes import config_to_datatype, numpy_dtype
from workers.backends import load_backend
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
