"""Async BLS: one ``digits`` call per row, all in flight at once (``async_exec``)."""

import asyncio

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            pixels = pb_utils.get_input_tensor_by_name(request, "PIXELS").as_numpy()
            calls = [
                pb_utils.InferenceRequest(
                    model_name="digits", requested_output_names=["label"],
                    inputs=[pb_utils.Tensor("input", pixels[i : i + 1])],
                ).async_exec()
                for i in range(len(pixels))
            ]
            answers = await asyncio.gather(*calls)
            failed = [a for a in answers if a.has_error()]
            if failed:
                raise pb_utils.TritonModelException(failed[0].error().message())
            labels = [pb_utils.get_output_tensor_by_name(a, "label").as_numpy() for a in answers]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LABEL", np.concatenate(labels))]))
        return responses
