"""``naiad deploy``: validate a model folder, plan what to upload, upload it.

Transport-free: the command line (``naiad/cli.py``) draws the progress bar and prints;
the store (:class:`RepositoryStore`, local or S3) moves the bytes. Three steps, each usable
alone:

1. :func:`validate_model_dir` checks the folder the way the server will index it (Triton's
   rules, :mod:`repository_store.index`) and a little stricter, so a mistake shows before any
   byte is uploaded: the config parses and validates (or, without ``config.pbtxt``, is
   auto-completed from the ONNX graph as the server will do), its ``name`` agrees with the
   model's name, every sub-folder is a numeric version, *every* version holds the backend's
   model file (a version outside the policy today may be selected tomorrow), the policy
   selects at least one, and each output's label file exists. An optional ``load_check``
   (``workers.load_check.load_check``) loads each version with its backend.
2. :func:`plan_upload` compares with what the repository already holds for that model and
   keeps only new or changed files (S3: size and ETag, multipart ETags included; a local
   repository: size and modification time, which :meth:`LocalStore.put_file` keeps), in an
   order that a polling server can never see half of: each version's files with the model
   file last, then the model folder's other files (labels), then ``config.pbtxt``.
3. :func:`upload` runs the plan.

Files and folders whose name starts with '.' are neither checked nor uploaded.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from naiad.errors import ConfigError, ModelNotFound, NaiadError
from repository_store.autocomplete import ONNX_FILENAME, complete_from_onnx, needs_autocomplete
from repository_store.config import (
    ModelConfig,
    backend_of,
    default_model_filename,
    parse_config,
    select_versions,
    validate_config,
)
from repository_store.store import CONFIG_FILENAME, FileInfo, RepositoryStore, is_version_name
from repository_store.store import validate_model_name as _validate_name

#: boto3's default multipart threshold and part size (``TransferConfig``): files above it are
#: uploaded in parts of this size, and their ETag is the MD5 of the parts' MD5s, "-<parts>".
S3_PART_BYTES = 8 * 1024 * 1024
_MD5_ETAG = re.compile(r"^[0-9a-f]{32}(-[0-9]+)?$")

LoadCheck = Callable[[Path, ModelConfig], None]


@dataclass
class ModelFolder:
    """A validated model folder. ``files``: paths relative to it ('/'-separated) of every
    file to upload; ``empty_folders``: version folders with no file (an ensemble's)."""

    name: str
    path: Path
    config: ModelConfig
    versions: list[int]
    files: list[str] = field(default_factory=list)
    empty_folders: list[str] = field(default_factory=list)


@dataclass
class UploadPlan:
    """What :func:`upload` sends, in order; ``unchanged`` files are already there."""

    model: ModelFolder
    uploads: list[str]
    folders: list[str]
    unchanged: list[str]

    @property
    def total_bytes(self) -> int:
        return sum((self.model.path / rel).stat().st_size for rel in self.uploads)


def validate_model_dir(path: str | os.PathLike[str], name: str | None = None,
                       load_check: LoadCheck | None = None) -> ModelFolder:
    """Check model folder ``path`` (served as ``name``, default: the folder's name).

    :raises ConfigError: naming the first problem found.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder")
    name = _model_name(name or folder.resolve().name)
    versions, files, empty = _layout(folder)
    config = _config(folder, name, versions)
    selected = select_versions(config, versions)
    if not selected:
        raise ConfigError(f"model '{name}': the version_policy selects none of the versions {versions}")
    _check_model_files(folder, config, versions, files)
    _check_labels(folder, config)
    if load_check is not None and backend_of(config) != "ensemble":
        for version in versions:
            _load(load_check, folder / str(version), config, version)
    return ModelFolder(name, folder, config, versions, files, empty)


def _model_name(name: str) -> str:
    try:
        return _validate_name(name)
    except ModelNotFound as exc:
        raise ConfigError(f"cannot deploy a model named {name!r}: {exc.message}") from None


def _layout(folder: Path) -> tuple[list[int], list[str], list[str]]:
    """Version numbers, files (relative) and empty version folders; non-numeric
    sub-folders are an error (Triton would silently ignore them)."""
    versions = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        if not is_version_name(entry.name):
            raise ConfigError(
                f"'{entry.name}' in {folder} is not a version folder (a number without leading "
                "zeros); Triton and Naiad would ignore it"
            )
        versions.append(int(entry.name))
    if not versions:
        raise ConfigError(f"{folder} has no version folder (1/, 2/, ...)")
    files = sorted(_files(folder))
    empty = [str(v) for v in versions if not any(f.startswith(f"{v}/") for f in files)]
    return sorted(versions), files, empty


def _files(folder: Path) -> Iterator[str]:
    for dirpath, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for filename in names:
            full = Path(dirpath, filename)
            if not filename.startswith(".") and full.is_file():
                yield full.relative_to(folder).as_posix()


def _config(folder: Path, name: str, versions: list[int]) -> ModelConfig:
    path = folder / CONFIG_FILENAME
    text = path.read_bytes() if path.is_file() else None
    config = parse_config(text, name) if text is not None else ModelConfig(name=name)
    if needs_autocomplete(config):
        config = _autocomplete(folder, config, select_versions(config, versions) or versions, text is None)
    validate_config(config)
    return config


def _autocomplete(folder: Path, config: ModelConfig, versions: list[int], no_config: bool) -> ModelConfig:
    """The server's auto-complete (:mod:`repository_store.autocomplete`), from the local file."""
    missing = "no config.pbtxt, and " if no_config else ""
    if config.platform not in ("", "onnxruntime_onnx") or config.backend not in ("", "onnxruntime"):
        raise ConfigError(f"{missing}only an ONNX model's config can be auto-completed")
    filename = config.default_model_filename or ONNX_FILENAME
    path = folder / str(max(versions)) / filename
    try:
        model = onnx.load(str(path), load_external_data=False)
    except FileNotFoundError:
        raise ConfigError(f"{missing}version {max(versions)} has no {filename} to complete it from") from None
    except Exception as exc:  # protobuf's DecodeError and friends: not an ONNX file
        raise ConfigError(f"{missing}{path} is not an ONNX model ({exc})") from None
    return complete_from_onnx(config, model)


def _check_model_files(folder: Path, config: ModelConfig, versions: list[int], files: list[str]) -> None:
    if backend_of(config) == "ensemble":
        return
    filename = default_model_filename(config)
    for version in versions:
        wanted = f"{version}/{filename}"
        if not any(f == wanted or f.startswith(wanted + "/") for f in files):
            raise ConfigError(f"version {version} of '{config.name}' has no '{filename}' ({folder / wanted})")


def _check_labels(folder: Path, config: ModelConfig) -> None:
    for output in config.output:
        if output.label_filename and not (folder / output.label_filename).is_file():
            raise ConfigError(
                f"label file '{output.label_filename}' of output '{output.name}' is missing from {folder}"
            )


def _load(load_check: LoadCheck, version_dir: Path, config: ModelConfig, version: int) -> None:
    try:
        load_check(version_dir, config)
    except NaiadError as exc:
        raise ConfigError(f"version {version} of '{config.name}' does not load: {exc.message}") from None
    except Exception as exc:  # the framework's own errors, whatever their class
        raise ConfigError(f"version {version} of '{config.name}' does not load: {exc}") from None


def plan_upload(model: ModelFolder, store: RepositoryStore) -> UploadPlan:
    """What to upload of ``model`` to ``store``, in a safe order (see the module doc).

    :raises RepositoryError: the store cannot be read.
    """
    remote = {info.path: info for info in store.list_model_files(model.name)}
    ordered = sorted(model.files, key=lambda rel: _upload_rank(rel, model.config))
    uploads, unchanged = [], []
    for rel in ordered:
        info = remote.get(rel)
        (unchanged if info is not None and _same(model.path / rel, info) else uploads).append(rel)
    present = {rel.split("/", 1)[0] for rel in remote if "/" in rel}
    folders = [v for v in model.empty_folders if v not in present]
    return UploadPlan(model, uploads, folders, unchanged)


def _upload_rank(rel: str, config: ModelConfig) -> tuple:
    """Sort key: version files (the model file last in each), other files, the config."""
    if rel == CONFIG_FILENAME:
        return (2, 0, 0, rel)
    head, sep, rest = rel.partition("/")
    if sep and is_version_name(head):
        model_file = backend_of(config) != "ensemble" and (
            rest == default_model_filename(config) or rest.startswith(default_model_filename(config) + "/")
        )
        return (0, int(head), int(model_file), rest)
    return (1, 0, 0, rel)


def _same(path: Path, info: FileInfo) -> bool:
    stat = path.stat()
    if stat.st_size != info.size:
        return False
    if _MD5_ETAG.match(info.etag):
        return info.etag == s3_etag(path)
    return info.etag == f"{stat.st_mtime_ns}-{stat.st_size}"


def s3_etag(path: Path, part_bytes: int = S3_PART_BYTES) -> str:
    """The ETag S3 gives ``path`` uploaded by boto3's ``upload_file`` with default settings:
    its MD5, or above ``part_bytes`` the MD5 of the parts' MD5s followed by ``-<parts>``."""
    digests = []
    with open(path, "rb") as reader:
        while chunk := reader.read(part_bytes):
            digests.append(hashlib.md5(chunk, usedforsecurity=False).digest())
    if path.stat().st_size < part_bytes:  # boto3: multipart from the threshold on
        return digests[0].hex() if digests else hashlib.md5(b"", usedforsecurity=False).hexdigest()
    return f"{hashlib.md5(b''.join(digests), usedforsecurity=False).hexdigest()}-{len(digests)}"


def upload(plan: UploadPlan, store: RepositoryStore, progress: Callable[[int], None] | None = None,
           on_file: Callable[[str], None] | None = None) -> None:
    """Run ``plan``: empty version folders, then the files in the plan's order.
    ``progress(n)`` gets byte counts as they go, ``on_file(rel)`` each file's path before it.

    :raises RepositoryError: a write failed (what was written before stays; a rerun of
        ``naiad deploy`` sends only what is still missing).
    """
    for rel in plan.folders:
        store.make_folder(plan.model.name, rel)
    for rel in plan.uploads:
        if on_file is not None:
            on_file(rel)
        store.put_file(plan.model.name, rel, plan.model.path / rel, progress)
