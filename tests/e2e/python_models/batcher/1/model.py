"""Doubles its input and reports how many requests its execute call received. A negative
input is an error for that request alone (INTERNAL, or INVALID_ARG for -400); 13 makes
execute raise, failing every request of the call."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x == 13).any():
                raise pb_utils.TritonModelException("unlucky 13")
            if (x == -400).any():
                error = pb_utils.TritonError("-400 is not a valid input", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            elif (x < 0).any():
                error = pb_utils.TritonError(f"negative input in request '{request.request_id()}'")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
            else:
                count = np.full(x.shape, len(requests), dtype=np.int32)
                outputs = [pb_utils.Tensor("OUTPUT0", x * 2), pb_utils.Tensor("REQUESTS", count)]
                responses.append(pb_utils.InferenceResponse(outputs))
        return responses
