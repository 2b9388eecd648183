"""``digits_python``: the example digits MLP (``model.onnx`` beside this file) run with ONNX
Runtime over the whole batch, as a Triton Python-backend model: the same file is served
unchanged by real Triton and by Naiad's Python backend in the ``peers`` benchmark
(docs/benchmarks.md).

Every request of one ``execute`` call is concatenated along dimension 0 (``max_batch_size``
32, each request [n, 64] FP32), run once, and split back by rows: ``probabilities`` [n, 10]
FP32 and ``label`` [n, 1] INT64, the graph's two outputs, as ``digits`` answers.
"""

from pathlib import Path

import numpy as np
import onnxruntime as ort

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = Path(__file__).with_name("model.onnx")  # beside model.py in the version folder
        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "input").as_numpy() for r in requests]
        feed = {"input": np.concatenate(inputs)}
        probabilities, labels = self.session.run(["probabilities", "label"], feed)
        responses, start = [], 0
        for rows in (len(x) for x in inputs):
            outputs = [pb_utils.Tensor("probabilities", probabilities[start : start + rows]),
                       pb_utils.Tensor("label", labels[start : start + rows])]  # fmt: skip
            responses.append(pb_utils.InferenceResponse(outputs))
            start += rows
        return responses
