"""The digits classifier as ONNX, TorchScript (``pytorch_libtorch``) and SavedModel
(``tensorflow_savedmodel``), served by one ``naiad serve`` and queried with NVIDIA's
tritonclient over HTTP and gRPC: the same inputs give the same outputs through every backend,
batched or not. Models whose files do not load, or whose config names tensors the model does
not have, fail their requests with the reason and leave the others serving.

The repository is built by ``examples/build_repository.py`` as a user would, plus broken
copies made here. One server for the module: each framework's first request pays a worker's
cold start (TensorFlow's import alone takes seconds).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from naiad_harness import run_server
from tritonclient.utils import InferenceServerException

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# model -> (input name, output names: probabilities, label)
DIGITS = {
    "digits": ("input", ("probabilities", "label")),
    "digits_pytorch": ("input__0", ("output__0", "output__1")),
    "digits_tensorflow": ("input", ("probabilities", "label")),
}
ATOL = 1e-5


def broken_models(root: Path) -> None:
    """Copies of the framework digits that cannot serve (see BROKEN)."""
    two_inputs = root / "torch_two_inputs"
    shutil.copytree(root / "digits_pytorch", two_inputs)
    config = (two_inputs / "config.pbtxt").read_text().replace('"digits_pytorch"', '"torch_two_inputs"')
    (two_inputs / "config.pbtxt").write_text(config.replace(
        '{ name: "input__0" data_type: TYPE_FP32 dims: [ 64 ] }',
        '{ name: "input__0" data_type: TYPE_FP32 dims: [ 64 ] },\n'
        '  { name: "input__1" data_type: TYPE_FP32 dims: [ 64 ] }',
    ))  # fmt: skip
    wrong_name = root / "tf_wrong_input"
    shutil.copytree(root / "digits_tensorflow", wrong_name)
    config = (wrong_name / "config.pbtxt").read_text().replace('"digits_tensorflow"', '"tf_wrong_input"')
    (wrong_name / "config.pbtxt").write_text(config.replace('name: "input"', 'name: "pixels"'))
    garbage_files = {"torch_garbage": ("digits_pytorch", "1/model.pt"),
                     "tf_garbage": ("digits_tensorflow", "1/model.savedmodel/saved_model.pb")}  # fmt: skip
    for name, (source, garbage) in garbage_files.items():
        shutil.copytree(root / source, root / name)
        config = (root / name / "config.pbtxt").read_text().replace(f'"{source}"', f'"{name}"')
        (root / name / "config.pbtxt").write_text(config)
        (root / name / garbage).write_bytes(b"\x00 not a model " * 8)


# model -> (inputs it is sent, what its error says)
BROKEN = {
    "torch_two_inputs": (["input__0", "input__1"], "configuration expects 2 inputs, model provides 1"),
    "tf_wrong_input": (["pixels"], "configuration names input 'pixels', which the signature does not have"),
    "torch_garbage": (["input__0"], "unable to load model 'torch_garbage' version 1 (pytorch)"),
    "tf_garbage": (["input"], "unable to load model 'tf_garbage' version 1 (tensorflow)"),
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("frameworks") / "models"
    models = [arg for name in DIGITS for arg in ("--model", name)]
    done = subprocess.run([sys.executable, str(EXAMPLES / "build_repository.py"), str(root), *models],
                          capture_output=True, text=True, timeout=110, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    broken_models(root)
    return root


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    with run_server(repository, tmp_path_factory.mktemp("server")) as running:
        yield running


@pytest.fixture(scope="module")
def http(server):
    client = httpclient.InferenceServerClient(server.url, network_timeout=90)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def infer(client, module, model: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(probabilities, label)`` of ``rows`` from ``model`` (``module``: tritonclient.http/grpc)."""
    input_name, outputs = DIGITS[model]
    tensor = module.InferInput(input_name, list(rows.shape), "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(rows))
    result = client.infer(model, [tensor], outputs=[module.InferRequestedOutput(name) for name in outputs])
    probabilities, label = (result.as_numpy(name) for name in outputs)
    assert probabilities.dtype == np.float32 and label.dtype == np.int64
    assert probabilities.shape == (len(rows), 10) and label.shape == (len(rows), 1)
    return probabilities, label


def assert_same(outputs: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    reference_probabilities, reference_label = outputs["digits"]
    for model, (probabilities, label) in outputs.items():
        np.testing.assert_allclose(probabilities, reference_probabilities, atol=ATOL, err_msg=model)
        np.testing.assert_array_equal(label, reference_label, err_msg=model)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_holdout_in_full_batches_is_the_same_everywhere(request, transport, digits_holdout):
    client, module = request.getfixturevalue(transport), httpclient if transport == "http" else grpcclient
    x, y = digits_holdout
    outputs = {}
    for model in DIGITS:
        parts = [infer(client, module, model, x[i : i + 64]) for i in range(0, len(x), 64)]
        outputs[model] = tuple(np.concatenate(arrays) for arrays in zip(*parts, strict=True))
    assert_same(outputs)
    assert float(np.mean(outputs["digits_pytorch"][1][:, 0] == y)) > 0.9


def test_single_rows_batched_by_the_server_are_the_same_everywhere(server, http, digits_holdout):
    """48 concurrent one-row requests per model (the dynamic batcher merges them), half over
    each transport, against the ONNX model's answer to the same rows in one request."""
    rows = digits_holdout[0][:48]
    expected = infer(http, httpclient, "digits", rows)

    async def one(client, module, model: str, i: int) -> np.ndarray:
        input_name, outputs = DIGITS[model]
        tensor = module.InferInput(input_name, [1, 64], "FP32")
        tensor.set_data_from_numpy(np.ascontiguousarray(rows[i : i + 1]))
        result = await client.infer(model, [tensor], outputs=[module.InferRequestedOutput(outputs[0])])
        return result.as_numpy(outputs[0])

    async def all_rows(model: str) -> np.ndarray:
        http_aio = aiohttpclient.InferenceServerClient(server.url, conn_limit=32)
        grpc_aio = aiogrpcclient.InferenceServerClient(server.grpc_url)
        try:
            clients = ((http_aio, aiohttpclient), (grpc_aio, aiogrpcclient))
            answers = await asyncio.gather(*(one(*clients[i % 2], model, i) for i in range(len(rows))))
        finally:
            await http_aio.close()
            await grpc_aio.close()
        return np.concatenate(answers)

    for model in DIGITS:
        np.testing.assert_allclose(asyncio.run(all_rows(model)), expected[0], atol=ATOL, err_msg=model)


def test_classification_extension_with_labels_file(http, digits_holdout):
    """``class_count`` on the probabilities output reads each model's ``labels.txt``."""
    rows = np.ascontiguousarray(digits_holdout[0][:4])
    top = {}
    for model, (input_name, (probabilities, _)) in DIGITS.items():
        tensor = httpclient.InferInput(input_name, [4, 64], "FP32")
        tensor.set_data_from_numpy(rows)
        requested = httpclient.InferRequestedOutput(probabilities, class_count=2)
        result = http.infer(model, [tensor], outputs=[requested])
        classes = result.as_numpy(probabilities)
        assert classes.shape == (4, 2)
        top[model] = [[entry.decode().split(":", 1)[1] for entry in row] for row in classes]  # index:label
    assert top["digits_pytorch"] == top["digits_tensorflow"] == top["digits"]


@pytest.mark.parametrize("model", sorted(BROKEN))
def test_a_model_that_does_not_load_fails_its_requests(http, grpc, digits_holdout, model):
    names, reason = BROKEN[model]
    row = np.ascontiguousarray(digits_holdout[0][:1])
    for client, module in ((http, httpclient), (grpc, grpcclient)):
        tensors = []
        for name in names:
            tensor = module.InferInput(name, [1, 64], "FP32")
            tensor.set_data_from_numpy(row)
            tensors.append(tensor)
        with pytest.raises(InferenceServerException) as caught:
            client.infer(model, tensors)
        assert reason in caught.value.message()
        assert caught.value.status() in ("400", "StatusCode.UNAVAILABLE")
    # the other models are untouched
    np.testing.assert_array_equal(infer(http, httpclient, "digits_pytorch", row)[1],
                                  infer(http, httpclient, "digits", row)[1])  # fmt: skip
