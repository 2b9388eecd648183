"""Triton's ``priority`` and ``timeout`` request parameters: checked once in the data plane,
and carried to the worker unchanged in the queue message."""

from __future__ import annotations

import numpy as np
import pytest

from naiad.codec import decode_request, encode_request
from naiad.errors import InvalidInput
from naiad.inference import InferRequest, Tensor
from naiad.model_client import check_scheduling_parameters

UINT64_MAX = 2**64 - 1


@pytest.mark.parametrize("name", ["priority", "timeout"])
@pytest.mark.parametrize("value", [0, 1, 10**6, UINT64_MAX])
def test_non_negative_integers_pass(name, value):
    check_scheduling_parameters({name: value})


@pytest.mark.parametrize("name", ["priority", "timeout"])
@pytest.mark.parametrize("value", [-1, 1.5, "3", True, {"us": 1}, [1], UINT64_MAX + 1])
def test_anything_else_is_invalid(name, value):
    with pytest.raises(InvalidInput, match=name):
        check_scheduling_parameters({name: value})


def test_absent_is_fine():
    check_scheduling_parameters({"other": -5})


def test_worker_gets_priority_and_timeout():
    tensor = Tensor("x", "FP32", [1], np.zeros(1, np.float32))
    params = {"priority": UINT64_MAX, "timeout": 250_000, "custom": "v"}
    request = InferRequest("m", 1, [tensor], id="r1", parameters=params)
    fields = encode_request("q", request, "reply", 1.0, 0.0)
    assert decode_request("m", fields).request.parameters == params
