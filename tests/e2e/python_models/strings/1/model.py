"""BYTES in and out: upper-cases UTF-8 strings (returned as ``str`` objects) and gives
each element's length in bytes."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            assert text.dtype == np.object_, text.dtype
            upper = np.array([item.decode("utf-8").upper() for item in text], dtype=np.object_)
            length = np.array([len(item) for item in text], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("UPPER", upper), pb_utils.Tensor("LENGTH", length)]))
        return responses
