"""`naiad deploy`: validation before any upload, the upload plan (only what changed, in an
order a polling server can never see half of) and the CLI's exit codes, on both stores."""

from __future__ import annotations

import shutil
from pathlib import Path

import boto3
import pytest
from rs_helpers import ENSEMBLE_CONFIG, write_tree

from naiad.errors import ConfigError
from naiad_cli.commands import main
from repository_store import LocalStore, S3Store, index_model, resolve_ensembles
from repository_store.deploy import ModelFolderStore, plan_upload, s3_etag, upload, validate_model_dir
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
        (lambda d: (d / "1" / "model.onnx").unlink(), "model 'digits': version 1 has no 'model.onnx'"),
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


def test_a_link_out_of_the_folder_is_refused_one_inside_is_uploaded(digits: Path, tmp_path: Path) -> None:
    """A file linked from outside the model folder would be uploaded as its target's bytes
    (``/etc/shadow`` into a bucket): refused, naming the link. A link within the folder is a
    file of the model like any other."""
    outside = tmp_path / "secret.txt"
    outside.write_text("not for the bucket")
    (digits / "1" / "secret.txt").symlink_to(outside)
    with pytest.raises(ConfigError, match=r"1/secret.txt in .* links outside the model folder"):
        validate_model_dir(digits)
    (digits / "1" / "secret.txt").unlink()
    (digits / "1" / "labels-copy.txt").symlink_to(digits / "labels.txt")
    assert "1/labels-copy.txt" in validate_model_dir(digits).files


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
    assert capsys.readouterr().err.splitlines()[-1].startswith("naiad deploy: ")  # after boto3's log lines
    assert store.list_models() == []


def test_cli_deploys(digits: Path, target, capsys) -> None:
    store, uri = target
    assert main(["deploy", str(digits), "--model-repository", uri, "--load-check"]) == 0
    assert "3 files uploaded" in capsys.readouterr().out
    assert index_model(store, "digits").ready
    assert main(["deploy", str(digits), "--model-repository", uri]) == 0
    assert "0 files uploaded, 3 unchanged" in capsys.readouterr().out


# --- the index's own rules (issue "Safe rollouts"): deploy refuses what the server refuses -----

#: rs_helpers' one-step ensemble, over digits: FP32 [64] in, its INT64 [1] label out.
ENSEMBLE = (
    ENSEMBLE_CONFIG.replace('"simple"', '"digits"').replace("dims: [ 4 ]", "dims: [ 64 ]")
    .replace("TYPE_FP32 dims: [ 3 ]", "TYPE_INT64 dims: [ 1 ]")
    .replace('input_map { key: "x"', 'input_map { key: "input"')
    .replace('output_map { key: "y"', 'output_map { key: "label"')
)


def test_a_python_model_the_server_completes_is_accepted(tmp_path: Path) -> None:
    """Auto-completion by the model's own ``auto_complete_config``, as the index does."""
    source = Path(__file__).parents[1] / "e2e" / "python_models" / "auto"
    folder = Path(shutil.copytree(source, tmp_path / "auto"))
    model = validate_model_dir(folder)
    assert model.config.backend == "python" and [i.name for i in model.config.input]
    assert index_model(ModelFolderStore(folder, "auto"), "auto").config == model.config


def test_rules_only_the_index_had_are_applied(digits: Path) -> None:
    text = (digits / "config.pbtxt").read_text()
    (digits / "config.pbtxt").write_text(text + "\n# padding\n" * 120_000)
    with pytest.raises(ConfigError, match="over the 1048576-byte limit"):
        validate_model_dir(digits)
    (digits / "config.pbtxt").write_text(
        text + '\nmodel_warmup [ { name: "w" batch_size: 1 inputs { key: "input" value: '
        '{ data_type: TYPE_FP32 dims: [ 64 ] input_data_file: "x.bin" } } } ]\n'
    )
    with pytest.raises(ConfigError, match="x.bin"):
        validate_model_dir(digits)


def test_an_ensemble_is_checked_against_the_target_repository(digits: Path, target, tmp_path: Path,
                                                              capsys) -> None:  # fmt: skip
    store, uri = target
    ensemble = write_tree(tmp_path / "src" / "ens", {"config.pbtxt": ENSEMBLE, "1": None})
    args = ["deploy", str(ensemble), "--model-repository", uri]
    assert main(args) == 1  # its composing model is not there yet: the server would refuse it
    assert "not in the repository: digits" in capsys.readouterr().err
    assert store.list_models() == []

    wrong = write_tree(tmp_path / "src" / "wrong", {"config.pbtxt": ENSEMBLE.replace(
        'output_map { key: "label"', 'output_map { key: "nope"'), "1": None})  # fmt: skip
    assert main(["deploy", str(digits), "--model-repository", uri]) == 0
    capsys.readouterr()
    assert main(["deploy", str(wrong), "--model-repository", uri, "--name", "ens"]) == 1
    assert "nope" in capsys.readouterr().err
    assert main(args) == 0
    assert "1 files uploaded, 0 unchanged, 1 empty version folders created" in capsys.readouterr().out
    assert main(args) == 0  # counts what it wrote: nothing
    assert capsys.readouterr().out.endswith(": 0 files uploaded, 1 unchanged\n")
    assert resolve_ensembles({n: index_model(store, n) for n in store.list_models()})["ens"].ready
