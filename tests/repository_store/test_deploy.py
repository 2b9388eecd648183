"""`naiad deploy`: validation before any upload, the upload plan (only what changed, in an
order a polling server can never see half of) and the CLI's exit codes, on both stores."""

from __future__ import annotations

import shutil
from pathlib import Path

import boto3
import pytest

from naiad.cli import main
from naiad.errors import ConfigError
from repository_store import LocalStore, S3Store, index_model
from repository_store.deploy import plan_upload, s3_etag, upload, validate_model_dir
from workers.load_check import load_check


@pytest.fixture
def digits(tmp_path: Path, example_repository: Path) -> Path:
    return Path(shutil.copytree(example_repository / "digits", tmp_path / "src" / "digits"))


@pytest.fixture(params=["local", "s3"])
def target(request, tmp_path: Path):
    """``(store, URI)`` of an empty repository, local or on moto's S3."""
    if request.param == "local":
        root = tmp_path / "repo"
        root.mkdir()
        return LocalStore(root), str(root)
    endpoint, bucket = request.getfixturevalue("s3_endpoint"), request.getfixturevalue("s3_bucket")
    return S3Store(bucket, "models", endpoint), f"s3://{endpoint.removeprefix('http://')}/{bucket}/models"


def test_valid_folder(digits: Path) -> None:
    model = validate_model_dir(digits, load_check=load_check)
    assert (model.name, model.versions) == ("digits", [1])
    assert model.files == ["1/model.onnx", "config.pbtxt", "labels.txt"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: (d / "config.pbtxt").write_text("max_batch_size: [ oops"), "does not parse"),
        (lambda d: (d / "1" / "model.onnx").unlink(), "version 1 of 'digits' has no 'model.onnx'"),
        (lambda d: (d / "labels.txt").unlink(), "label file 'labels.txt'"),
        (lambda d: (d / "v2").mkdir(), "'v2' .* is not a version folder"),
        (lambda d: shutil.rmtree(d / "1"), "no version folder"),
        (lambda d: (d / "config.pbtxt").write_text(
            (d / "config.pbtxt").read_text().replace('name: "digits"', 'name: "other"')),
         "name 'other' does not match the model folder 'digits'"),
        (lambda d: (d / "config.pbtxt").write_text(
            (d / "config.pbtxt").read_text().replace("TYPE_FP32 dims: [ 64 ]", "TYPE_FP32 dims: [ 0 ]")),
         "dims must be"),
    ],
)
def test_invalid_folders_are_refused(digits: Path, change, message: str) -> None:
    change(digits)
    with pytest.raises(ConfigError, match=message):
        validate_model_dir(digits)


def test_name_flag_and_autocomplete(digits: Path) -> None:
    with pytest.raises(ConfigError, match="does not match"):
        validate_model_dir(digits, name="digits2")  # the config says "digits"
    (digits / "config.pbtxt").unlink()
    (digits / "labels.txt").unlink()
    model = validate_model_dir(digits, name="digits2")
    assert model.name == "digits2" and model.config.platform == "onnxruntime_onnx"
    assert [i.name for i in model.config.input] == ["input"]


def test_load_check_catches_a_file_that_does_not_load(digits: Path) -> None:
    (digits / "1" / "model.onnx").write_bytes(b"not an onnx graph")
    validate_model_dir(digits)  # a config is given: without the load check this passes
    with pytest.raises(ConfigError, match="version 1 of 'digits' does not load"):
        validate_model_dir(digits, load_check=load_check)


def test_upload_order_then_only_changes(digits: Path, target) -> None:
    store, _uri = target
    (digits / "2").mkdir()
    (digits / "2" / "model.onnx").write_bytes((digits / "1" / "model.onnx").read_bytes())
    (digits / "2" / "extra.bin").write_bytes(b"side file")
    model = validate_model_dir(digits)
    plan = plan_upload(model, store)
    assert plan.uploads == ["1/model.onnx", "2/extra.bin", "2/model.onnx", "labels.txt", "config.pbtxt"]
    seen: list[int] = []
    upload(plan, store, seen.append)
    assert sum(seen) == plan.total_bytes
    assert index_model(store, "digits").ready

    again = plan_upload(validate_model_dir(digits), store)
    assert again.uploads == [] and len(again.unchanged) == 5
    labels = (digits / "labels.txt").read_text()
    (digits / "labels.txt").write_text(labels.replace("0", "O", 1))  # same size, new content
    assert plan_upload(validate_model_dir(digits), store).uploads == ["labels.txt"]


def test_multipart_etag_is_recognised(tmp_path: Path, s3_endpoint: str, s3_bucket: str) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"\x01" * (9 * 1024 * 1024))  # above boto3's 8 MiB multipart threshold
    boto3.client("s3", endpoint_url=s3_endpoint).upload_file(str(big), s3_bucket, "m/1/big.bin")
    [info] = S3Store(s3_bucket, "", s3_endpoint).list_model_files("m")
    assert info.etag.endswith("-2") and info.etag == s3_etag(big)


@pytest.mark.parametrize("breakage", ["config", "missing", "name"])
def test_cli_refuses_invalid_models_and_uploads_nothing(digits: Path, target, breakage, capsys) -> None:
    store, uri = target
    args = ["deploy", str(digits), "--model-repository", uri]
    if breakage == "config":
        (digits / "config.pbtxt").write_text("platform: onnxruntime_onnx input [ {")
    elif breakage == "missing":
        (digits / "1" / "model.onnx").unlink()
    else:
        args += ["--name", "renamed"]
    assert main(args) == 1
    assert capsys.readouterr().err.startswith("naiad deploy: ")
    assert store.list_models() == []


def test_cli_deploys(digits: Path, target, capsys) -> None:
    store, uri = target
    assert main(["deploy", str(digits), "--model-repository", uri, "--load-check"]) == 0
    assert "3 files uploaded" in capsys.readouterr().out
    assert index_model(store, "digits").ready
    assert main(["deploy", str(digits), "--model-repository", uri]) == 0
    assert "0 files uploaded, 3 unchanged" in capsys.readouterr().out
