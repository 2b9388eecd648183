"""Helpers for the repository_store tests: a small Triton-layout repository, written to a
folder and uploaded to S3."""

from __future__ import annotations

import pathlib

import boto3

ONNX_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 3 ] }} ]
{extra}
"""

ENSEMBLE_CONFIG = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
ensemble_scheduling { step [ {
  model_name: "simple" model_version: -1
  input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } } ] }
"""


def onnx_config(name: str, extra: str = "") -> str:
    return ONNX_CONFIG.format(name=name, extra=extra)


def write_tree(root: pathlib.Path, files: dict[str, bytes | str | None]) -> pathlib.Path:
    """Write ``{relative path: content}``; content None makes an empty folder."""
    for rel, content in files.items():
        path = root / rel
        if content is None:
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


REPOSITORY: dict[str, bytes | str | None] = {
    "simple/config.pbtxt": onnx_config("simple"),
    "simple/1/model.onnx": b"v1",
    "simple/2/model.onnx": b"v2",
    "simple/3/model.onnx": b"v3-model",
    "simple/3/extra/data.bin": b"\x00" * 10,
    "simple/03/model.onnx": b"leading zero: ignored",
    "simple/latest/model.onnx": b"not numeric: ignored",
    "noname/config.pbtxt": onnx_config("", "version_policy { all { } }"),
    "noname/1/model.onnx": b"1",
    "noname/2/model.onnx": b"2",
    "broken/config.pbtxt": "platform: onnxruntime_onnx max_batch_size: [",
    "broken/1/model.onnx": b"1",
    "noconfig/1/model.onnx": b"1",
    "nofile/config.pbtxt": onnx_config("nofile"),
    "nofile/1/readme.txt": b"no model here",
    "noversion/config.pbtxt": onnx_config("noversion", "version_policy { specific { versions: [ 7 ] } }"),
    "noversion/1/model.onnx": b"1",
    "tf/config.pbtxt": onnx_config("tf").replace("onnxruntime_onnx", "tensorflow_savedmodel"),
    "tf/1/model.savedmodel/saved_model.pb": b"pb",
    "ens/config.pbtxt": ENSEMBLE_CONFIG,
    "ens/1/": None,
    ".hidden/config.pbtxt": onnx_config(".hidden"),
    "{tagged}/config.pbtxt": onnx_config("{tagged}"),
    "notes.txt": b"a file, not a model",
}
GOOD_MODELS = ["ens", "noname", "simple", "tf"]
ALL_MODELS = ["broken", "ens", "noconfig", "nofile", "noname", "noversion", "simple", "tf"]


def upload_tree(endpoint: str, bucket: str, prefix: str, root: pathlib.Path) -> None:
    """Upload every file under ``root`` to ``s3://bucket/prefix/``; an empty folder becomes a
    ``folder/`` marker object, as S3 consoles create."""
    client = boto3.client("s3", endpoint_url=endpoint)
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        key = f"{prefix}/{rel}" if prefix else rel
        if path.is_file():
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
        elif not any(path.iterdir()):
            client.put_object(Bucket=bucket, Key=key + "/", Body=b"")
