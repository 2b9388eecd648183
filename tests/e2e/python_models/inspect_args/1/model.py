"""Echoes what Triton gave it: initialize's args, and each request's id, parameters and
requested outputs; finalize writes a file named by the config's ``finalize_file``. It also
says whether each call ran on the thread that ran ``initialize`` (Triton's stub makes every
call from one thread; state such as a ``threading.local`` relies on it)."""

import json
import threading

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        config = json.loads(args["model_config"])
        self.finalize_file = config["parameters"]["finalize_file"]["string_value"]
        self.executions = 0
        self.local = threading.local()
        self.local.made_here = True
        self.threads = {threading.get_ident()}

    def execute(self, requests):
        self.executions += 1
        self.threads.add(threading.get_ident())
        responses = []
        for request in requests:
            seen = {
                "request_id": request.request_id(),
                "parameters": json.loads(request.parameters()),
                "requested_output_names": sorted(request.requested_output_names()),  # a set, as in Triton
                "model_name": request.model_name(),
                "model_version": request.model_version(),
                "in": pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().tolist(),
                "initialize_thread_local": getattr(self.local, "made_here", False),
            }
            outputs = [
                pb_utils.Tensor("ARGS", np.array([json.dumps(self.args).encode()], dtype=np.object_)),
                pb_utils.Tensor("REQUEST", np.array([json.dumps(seen).encode()], dtype=np.object_)),
                pb_utils.Tensor("EXTRA", np.array([1.5], dtype=np.float32)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses

    def finalize(self):
        self.threads.add(threading.get_ident())
        with open(self.finalize_file, "w") as out:
            json.dump({"model_name": self.args["model_name"], "executions": self.executions,
                       "threads": len(self.threads)}, out)
