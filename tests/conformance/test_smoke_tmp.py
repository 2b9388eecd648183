import numpy as np
import requests
from conformance_client import Client


def test_smoke(server):
    for kind in ("http", "http_aio", "grpc", "grpc_aio"):
        c = Client(kind, server)
        print(kind, c("get_server_metadata"))
        print(c("get_model_repository_index"))
        print(c.infer("reshape_scalar", {"x": (np.array([[1], [5]], np.int64), "INT64")}))
        print(c.infer("versioned", {"x": (np.ones((2, 3), np.float32), "FP32")}, model_version="1"))
        print(c("get_model_config", "versioned"))
        print(c("get_model_metadata", "reshape_scalar"))
        print(c("get_inference_statistics", "versioned", "1"))
    print(requests.post(server.http + "/v2/models/digits/infer", json={"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}], "outputs": [{"name": "label"}, {"name": "label"}]}).text)
