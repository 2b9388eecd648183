"""The KServe Python model server (``kserve.ModelServer``) serving one ONNX file, v2 protocol.

A ``kserve.Model`` whose ``predict`` runs ONNX Runtime on the decoded ``InferRequest`` (default
session options, as Naiad's worker). KServe reads its own flags (``--http_port``,
``--grpc_port``, ``--workers``, ``--configure_logging`` ...) from the command line when it is
imported; ours are ``--model_name`` and ``--model_path``. Logging is WARNING and up only.
Runs inside ``.bench/venvs/kserve``:

    .bench/venvs/kserve/bin/python bench/peers/kserve_server.py --model_name digits \\
        --model_path .bench/repository/digits/1/model.onnx --http_port 8080 --grpc_port 8081
"""

from __future__ import annotations

import argparse
import logging

import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

V2_TYPES = {"float32": "FP32", "float64": "FP64", "int64": "INT64", "int32": "INT32", "bool": "BOOL"}


class OnnxModel(Model):
    def __init__(self, name: str, path: str):
        super().__init__(name)
        self.path = path
        self.load()

    def load(self) -> bool:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self.session = ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])
        self.output_names = [output.name for output in self.session.get_outputs()]
        self.ready = True
        return self.ready

    def predict(self, payload: InferRequest, headers: dict[str, str] | None = None) -> InferResponse:
        feeds = {tensor.name: tensor.as_numpy() for tensor in payload.inputs}
        names = [output.name for output in payload.request_outputs or []] or self.output_names
        outputs = []
        for name, array in zip(names, self.session.run(names, feeds), strict=True):
            output = InferOutput(name=name, shape=list(array.shape), datatype=V2_TYPES[array.dtype.name])
            output.set_data_from_numpy(array, binary_data=False)
            outputs.append(output)
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=outputs)


def main() -> None:
    parser = argparse.ArgumentParser()  # kserve parses its own flags (and --model_name) itself
    parser.add_argument("--model_name", required=True)
    parser.add_argument("--model_path", required=True)
    args, _ = parser.parse_known_args()
    # With --configure_logging false nothing installs KServe's INFO handlers: its per-request
    # access and timing records (on by default) are dropped at WARNING, as a tuned deployment would.
    logging.basicConfig(level=logging.WARNING)
    ModelServer().start([OnnxModel(args.model_name, args.model_path)])


if __name__ == "__main__":
    main()
