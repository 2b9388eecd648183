"""Triton's classification extension: an output answered as its top ``class_count`` classes.

docs/protocol/extension_classification.md: instead of the tensor, the response holds a BYTES
tensor of ``"value:index"`` strings, or ``"value:index:label"`` when the output has a label
file, highest value first. With a batch dimension each row is classified on its own and the
result has shape ``[batch, class_count]``; without one, shape ``[class_count]``. Triton
formats the value with C++ ``std::to_string`` of the output's element type: six decimals
(``"%f"``) for floats, the plain number for integers.
"""

from __future__ import annotations

import numpy as np

from naiad.errors import InvalidInput
from naiad.inference import Tensor


def _format(value: np.generic) -> str:
    """C++ ``std::to_string`` of the element: integers as they are, floats with ``%f``."""
    return str(int(value)) if np.issubdtype(value.dtype, np.integer) else f"{float(value):f}"


def _row(values: np.ndarray, count: int, labels: list[str]) -> list[bytes]:
    order = np.argsort(-values.astype(np.float64), kind="stable")[:count]
    out = []
    for index in order:
        text = f"{_format(values[index])}:{int(index)}"
        if index < len(labels):
            text += f":{labels[index]}"
        out.append(text.encode())
    return out


def classify(tensor: Tensor, class_count: int, batched: bool, labels: list[str]) -> Tensor:
    """Replace ``tensor`` by its top ``class_count`` classes per row.

    ``tensor.data``: numeric, ``[batch, ...]`` when ``batched`` else ``[...]``; the
    non-batch dimensions are flattened into the class axis. Raises :class:`InvalidInput`
    for a BYTES or BOOL output, which has no order.
    """
    if tensor.datatype in ("BYTES", "BOOL"):
        raise InvalidInput(f"output '{tensor.name}' of type {tensor.datatype} cannot be classified")
    data = tensor.data
    rows = data.reshape(data.shape[0], -1) if batched else data.reshape(1, -1)
    count = min(class_count, rows.shape[1])
    result = np.empty((rows.shape[0], count), dtype=np.object_)
    for r, values in enumerate(rows):
        result[r] = _row(values, count, labels)
    if not batched:
        result = result.reshape(count)
    return Tensor(tensor.name, "BYTES", list(result.shape), result)
