"""Echoes what Triton gave it: initialize's args, and each request's id, parameters and
requested outputs; finalize writes a file named by the config's ``finalize_file``."""

import json

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        config = json.loads(args["model_config"])
        self.finalize_file = config["parameters"]["finalize_file"]["string_value"]
        self.executions = 0

    def execute(self, requests):
        self.executions += 1
        responses = []
        for request in requests:
            seen = {
                "request_id": request.request_id(),
                "parameters": json.loads(request.parameters()),
                "requested_output_names": request.requested_output_names(),
                "model_name": request.model_name(),
                "model_version": request.model_version(),
                "in": pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().tolist(),
            }
            outputs = [
                pb_utils.Tensor("ARGS", np.array([json.dumps(self.args).encode()], dtype=np.object_)),
                pb_utils.Tensor("REQUEST", np.array([json.dumps(seen).encode()], dtype=np.object_)),
                pb_utils.Tensor("EXTRA", np.array([1.5], dtype=np.float32)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses

    def finalize(self):
        with open(self.finalize_file, "w") as out:
            json.dump({"model_name": self.args["model_name"], "executions": self.executions}, out)
