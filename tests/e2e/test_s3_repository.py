"""The example repository served from S3 (moto's server, Triton's s3://host:port/... form)."""

from __future__ import annotations

import numpy as np
import tritonclient.http as httpclient
from naiad_harness import upload_tree


def test_digits_from_s3_equals_onnxruntime(
    naiad_server, s3_endpoint, s3_bucket, example_repository, digits_onnx, digits_holdout
):
    upload_tree(s3_endpoint, s3_bucket, example_repository, "team/models")
    host_port = s3_endpoint.removeprefix("http://")
    server = naiad_server(repository=f"s3://{host_port}/{s3_bucket}/team/models")
    triton = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        assert triton.is_server_ready()
        assert triton.is_model_ready("digits")
        x = np.ascontiguousarray(digits_holdout[0][:16])
        tensor = httpclient.InferInput("input", [16, 64], "FP32")
        tensor.set_data_from_numpy(x)
        result = triton.infer("digits", [tensor])
    finally:
        triton.close()
    probabilities, label = digits_onnx.run(["probabilities", "label"], {"input": x})
    np.testing.assert_allclose(result.as_numpy("probabilities"), probabilities, rtol=1e-5)
    np.testing.assert_array_equal(result.as_numpy("label"), label)
    assert "pulled digits/1" in server.log()
    assert list(server.cache_dir.glob("*/digits/1/model.onnx"))
