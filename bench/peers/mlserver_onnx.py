"""An MLServer runtime serving one ONNX file with ONNX Runtime (MLServer ships none for ONNX).

``model-settings.json``: ``"implementation": "mlserver_onnx.OnnxModel"``, ``parameters.uri``
the ``model.onnx`` path. Inputs are decoded and outputs encoded with MLServer's own
``NumpyCodec``; with adaptive batching (``max_batch_size`` > 1) MLServer stacks requests along
dimension 0 before :meth:`OnnxModel.predict` and splits the answer after. The session uses
ONNX Runtime's default options, as Naiad's worker does. Runs inside ``.bench/venvs/mlserver``.
"""

from __future__ import annotations

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self._session = ort.InferenceSession(
            self.settings.parameters.uri, options, providers=["CPUExecutionProvider"]
        )
        self._outputs = [output.name for output in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {tensor.name: NumpyCodec.decode_input(tensor) for tensor in payload.inputs}
        names = [output.name for output in payload.outputs or []] or self._outputs
        results = self._session.run(names, feeds)
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[
                NumpyCodec.encode_output(name, array) for name, array in zip(names, results, strict=True)
            ],
        )
