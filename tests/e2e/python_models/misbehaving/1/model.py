"""Answers with outputs that contradict its config, as the request's ``mode`` parameter
says: ``undeclared`` (``W`` instead of ``Y``), ``none``, ``int32`` (``Y`` as INT32),
``wide`` (``Y`` five wide), ``rows`` (``Y`` with twice the rows); anything else is right,
plus an undeclared ``W`` that Triton drops."""

import json

import numpy as np

import triton_python_backend_utils as pb_utils


def outputs(mode, x):
    z = pb_utils.Tensor("Z", np.ones((len(x), 1), np.int32))
    if mode == "undeclared":
        return [pb_utils.Tensor("W", x), z]
    if mode == "none":
        return []
    if mode == "int32":
        return [pb_utils.Tensor("Y", x.astype(np.int32)), z]
    if mode == "wide":
        return [pb_utils.Tensor("Y", np.zeros((len(x), 5), np.float32)), z]
    if mode == "rows":
        return [pb_utils.Tensor("Y", np.concatenate([x, x])), z]
    return [pb_utils.Tensor("Y", x * 2), z, pb_utils.Tensor("W", x)]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = json.loads(request.parameters()).get("mode", "")
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs(mode, x)))
        return responses
