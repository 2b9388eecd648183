"""Pure functions of the dynamic batcher: which requests may share a batch, merge, split.

Triton's dynamic batcher (docs/user_guide/batcher.md, "Dynamic Batcher") batches along the
implicit first dimension requests whose other dimensions and requested outputs agree; a
request carrying its own batch of N rows counts as N. Every function here is free of I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from naiad.inference import InferRequest


def rows(request: InferRequest) -> int:
    """Rows a request adds to a batch: its leading dimension (all inputs agree on it)."""
    return request.inputs[0].shape[0] if request.inputs[0].shape else 1


def batch_key(request: InferRequest) -> Hashable:
    """Requests with equal keys may be concatenated along dimension 0."""
    inputs = tuple(sorted((t.name, t.datatype, tuple(t.shape[1:])) for t in request.inputs))
    outputs = tuple(sorted(output.name for output in request.outputs))
    return request.version, inputs, outputs


def plan_batches(requests: Sequence[InferRequest], max_rows: int) -> list[list[int]]:
    """Group request indices into batches of compatible requests, in arrival order.

    Each batch holds at most ``max_rows`` rows, except that a single request is never split
    (the gateway already bounds a request to ``max_batch_size``). Returns lists of indices.
    """
    open_batches: dict[Hashable, list[int]] = {}
    open_rows: dict[Hashable, int] = {}
    batches: list[list[int]] = []
    for index, request in enumerate(requests):
        key, size = batch_key(request), rows(request)
        if key in open_batches and open_rows[key] + size <= max_rows:
            open_batches[key].append(index)
            open_rows[key] += size
            continue
        open_batches[key], open_rows[key] = [index], size
        batches.append(open_batches[key])
    return batches


def merge(requests: Sequence[InferRequest]) -> dict[str, np.ndarray]:
    """Concatenate the inputs of compatible requests along dimension 0, by input name."""
    names = [tensor.name for tensor in requests[0].inputs]
    if len(requests) == 1:
        return {tensor.name: tensor.data for tensor in requests[0].inputs}
    by_name = [{t.name: t.data for t in request.inputs} for request in requests]
    return {name: np.concatenate([inputs[name] for inputs in by_name]) for name in names}


def split(outputs: dict[str, np.ndarray], sizes: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Cut batched outputs back into one dict per request, ``sizes`` rows each, in order.

    Raises ValueError when an output's first dimension is not ``sum(sizes)``.
    """
    total = sum(sizes)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise ValueError(f"output '{name}' has shape {array.shape}, expected {total} rows")
    bounds = np.cumsum([0, *sizes])
    return [
        {name: array[start:end] for name, array in outputs.items()}
        for start, end in zip(bounds[:-1], bounds[1:], strict=True)
    ]
