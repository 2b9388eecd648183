"""Runs a coroutine of its own on an event loop of its own inside a plain ``execute``, as a
model wrapping an async client (from a helper package) does: Triton's stub calls ``execute``
where no event loop runs, and so must a worker, however quick the model's batches (Y = 2 X).
The loop module is looked up by a built name, as a helper outside this folder would hide it."""

import importlib

import triton_python_backend_utils as pb_utils

loops = importlib.import_module("async" + "io")


async def double(x):
    await loops.sleep(0)
    return x * 2


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", loops.run(double(x)))]))
        return responses
