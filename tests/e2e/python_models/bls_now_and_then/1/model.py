"""Business Logic Scripting some of the time, from sources that never name the request
class: PIXELS are classified by ``digits`` through a BLS call when the request's parameter
``call`` is true, else labelled -1 at once. EXECUTES counts this instance's ``execute``
calls, so a test sees a batch that ran twice; ON_LOOP_THREAD says whether ``execute`` ran on
the worker's main thread (where its event loop runs) rather than in a thread of its own."""

import json
import threading

import numpy as np

import triton_python_backend_utils as pb_utils

#: Looked up by a built name, so Naiad's look at these sources finds no BLS call in them.
CALL = getattr(pb_utils, "Inference" + "Request")


class TritonPythonModel:
    def initialize(self, args):
        self.executes = 0

    def execute(self, requests):
        self.executes += 1
        on_loop = threading.current_thread() is threading.main_thread()
        responses = []
        for request in requests:
            pixels = pb_utils.get_input_tensor_by_name(request, "PIXELS").as_numpy()
            if json.loads(request.parameters()).get("call"):
                inputs = [pb_utils.Tensor("input", pixels)]
                reply = CALL(model_name="digits", requested_output_names=["label"], inputs=inputs).exec()
                label = pb_utils.get_output_tensor_by_name(reply, "label").as_numpy()
            else:
                label = np.full((len(pixels), 1), -1, np.int64)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("LABEL", label),
                pb_utils.Tensor("EXECUTES", np.array([self.executes], np.int64)),
                pb_utils.Tensor("ON_LOOP_THREAD", np.array([on_loop])),
            ]))
        return responses
