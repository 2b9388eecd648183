"""Upload-to-live in poll mode: a running `naiad serve --model-control-mode poll` serves a
model uploaded by `naiad deploy` (to S3 on moto, and to a local folder) and one uploaded by
plain boto3, without a restart."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import numpy as np
import tritonclient.http as httpclient
from naiad_harness import ROOT, wait_for

POLL = ["--model-control-mode", "poll", "--repository-poll-secs", "1"]
LIVE_WAIT_S = 20


def _deploy(model_dir: Path, uri: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "naiad_cli", "deploy", str(model_dir),
                           "--model-repository", uri, *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def _live(server, model: str) -> np.ndarray:
    triton = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        wait_for(lambda: triton.is_model_ready(model), LIVE_WAIT_S, f"{model} ready")
        tensor = httpclient.InferInput("input", [2, 64], "FP32")
        tensor.set_data_from_numpy(np.ones((2, 64), np.float32))
        return triton.infer(model, [tensor]).as_numpy("label")
    finally:
        triton.close()


def _renamed(source: Path, name: str, into: Path) -> Path:
    folder = Path(shutil.copytree(source, into / name))
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "digits"', f'name: "{name}"'))
    return folder


def test_deploy_and_boto3_uploads_go_live_on_s3(
    naiad_server, s3_endpoint, s3_bucket, example_repository, tmp_path
) -> None:
    uri = f"s3://{s3_endpoint.removeprefix('http://')}/{s3_bucket}/models"
    server = naiad_server(repository=uri, extra_args=POLL)
    deployed = _deploy(example_repository / "digits", uri, "--load-check")
    assert deployed.returncode == 0, deployed.stderr
    assert _live(server, "digits").shape == (2, 1)

    # Any tool: plain boto3, version folder first and the config last.
    folder = _renamed(example_repository / "digits", "digits_boto", tmp_path)
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    for rel in ("1/model.onnx", "labels.txt", "config.pbtxt"):
        client.upload_file(str(folder / rel), s3_bucket, f"models/digits_boto/{rel}")
    assert _live(server, "digits_boto").shape == (2, 1)

    broken = _renamed(example_repository / "digits", "digits_broken", tmp_path)
    (broken / "1" / "model.onnx").unlink()
    refused = _deploy(broken, uri)
    assert refused.returncode == 1 and "has no 'model.onnx'" in refused.stderr
    listed = client.list_objects_v2(Bucket=s3_bucket, Prefix="models/digits_broken/")
    assert listed["KeyCount"] == 0


def test_deploy_to_a_local_repository_goes_live(naiad_server, example_repository, tmp_path) -> None:
    repository = tmp_path / "models"
    repository.mkdir()
    server = naiad_server(repository=repository, extra_args=POLL)
    source = _renamed(example_repository / "digits", "digits_local", tmp_path / "src")
    deployed = _deploy(source, str(repository))
    assert deployed.returncode == 0, deployed.stderr
    assert _live(server, "digits_local").shape == (2, 1)
