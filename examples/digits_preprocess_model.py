"""``digits_preprocess``: Triton Python-backend model that turns raw 8x8 digit images into the
normalised features the ``digits_mlp`` classifier expects (the first step of the
``digits_ensemble`` example, Triton's classic preprocessing ensemble).

``build_repository.py`` installs this file as ``digits_preprocess/1/model.py`` next to
``normalization.json`` (the training split's StandardScaler statistics). It uses only Triton's
standard ``triton_python_backend_utils`` API, so the same folder runs on Triton.

- input ``pixels``: UINT8 [batch, 8, 8], grey levels 0..16 (scikit-learn's digits scale);
- output ``features``: FP32 [batch, 64], ``(pixel - mean) / scale`` per pixel position.

A request with a pixel above 16 gets an INVALID_ARG error (400); the other requests of the
same batch are answered.
"""

import json
import os

import numpy as np

import triton_python_backend_utils as pb_utils

MAX_PIXEL = 16


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        output = pb_utils.get_output_config_by_name(config, "features")
        self.dtype = pb_utils.triton_string_to_numpy(output["data_type"])
        path = os.path.join(args["model_repository"], args["model_version"], "normalization.json")
        with open(path) as file:
            statistics = json.load(file)
        self.mean = np.asarray(statistics["mean"], dtype=np.float32)
        self.scale = np.asarray(statistics["scale"], dtype=np.float32)

    def execute(self, requests):
        return [self._respond(request) for request in requests]

    def _respond(self, request):
        pixels = pb_utils.get_input_tensor_by_name(request, "pixels").as_numpy()
        brightest = int(pixels.max(initial=0))
        if brightest > MAX_PIXEL:
            message = f"pixel values must be 0..{MAX_PIXEL}, got {brightest}"
            error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
            return pb_utils.InferenceResponse(output_tensors=[], error=error)
        flat = pixels.reshape(len(pixels), -1).astype(np.float32)
        features = ((flat - self.mean) / self.scale).astype(self.dtype)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("features", features)])

    def finalize(self):
        self.mean = self.scale = None
