"""Business Logic Scripting: classifies PIXELS by calling another model (``digits``
unless the request's parameter ``target`` names another one) and passes on its error. The
request's parameters ``call_priority`` and ``call_timeout`` (µs) become the call's
``priority`` parameter and ``timeout``."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            parameters = json.loads(request.parameters())
            pixels = pb_utils.get_input_tensor_by_name(request, "PIXELS")
            call = pb_utils.InferenceRequest(
                model_name=parameters.get("target", "digits"),
                model_version=int(parameters.get("version", -1)),
                requested_output_names=["label"],
                inputs=[pb_utils.Tensor("input", pixels.as_numpy())],
                timeout=int(parameters.get("call_timeout", 0)),
                parameters={"priority": parameters["call_priority"]} if "call_priority" in parameters else {},
            )
            response = call.exec()
            if response.has_error():
                error = response.error()
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"BLS failed: {error.message()}", error.code())))
                continue
            label = pb_utils.get_output_tensor_by_name(response, "label")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LABEL", label.as_numpy())]))
        return responses
