"""Transport-free inference request and response types, shared by gateway and workers.

A tensor's ``data`` is a numpy array already shaped to ``shape``; BYTES tensors are object
arrays of ``bytes``. Field names follow the KServe v2 inference request/response JSON
objects ("Inference Request JSON Object", "Inference Response JSON Object").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Tensor:
    """One named tensor: ``datatype`` is a v2 datatype (``FP32``, ``BYTES``, ...)."""

    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray


@dataclass(frozen=True)
class SharedMemoryRef:
    """A tensor in a registered system shared memory region (Triton's shared memory
    extension): ``byte_size`` bytes at ``offset`` into region ``region``. Never queued: the
    gateway reads inputs from and writes outputs to the region (``gateway/shared_memory.py``)."""

    region: str
    byte_size: int
    offset: int = 0


@dataclass
class RequestedOutput:
    """An output the client asked for. ``binary`` is the HTTP binary extension's per-output
    choice (None = the request's default); ``class_count`` > 0 asks for classification;
    ``shared_memory``: the region the answer is written to instead of the response."""

    name: str
    binary: bool | None = None
    class_count: int = 0
    shared_memory: SharedMemoryRef | None = None


@dataclass
class InferRequest:
    """A validated request for one model version. ``outputs`` empty means all outputs."""

    model: str
    version: int
    inputs: list[Tensor]
    outputs: list[RequestedOutput] = field(default_factory=list)
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferResponse:
    """The answer to one :class:`InferRequest`, outputs in the model's output order."""

    model: str
    version: int
    outputs: list[Tensor]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
