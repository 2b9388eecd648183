"""``naiad deploy``: validate a model folder, plan what to upload, upload it.

Transport-free: the command line (``naiad_cli/commands.py``) draws the progress bar and prints;
the store (:class:`RepositoryStore`, local or S3) moves the bytes. Three steps, each usable
alone:

1. :func:`validate_model_dir` indexes the folder with the server's own function
   (:func:`repository_store.index.index_model` over :class:`ModelFolderStore`, the folder seen
   as a one-model repository), so it refuses exactly what the server would mark
   UNAVAILABLE (config, auto-completion, version policy, model files, labels, warmup files,
   the config size limit), an ensemble also against the composing models the target
   repository holds (:func:`repository_store.resolve_ensembles`, as the registry does). Then
   a little stricter, so a mistake shows before any byte is uploaded: every sub-folder is a
   numeric version, *every* version holds the backend's model file (a version outside the
   policy today may be selected tomorrow). An optional ``load_check``
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

from naiad.errors import ConfigError, ModelNotFound, NaiadError
from naiad.registry import ModelEntry
from repository_store.config import ModelConfig, backend_of, default_model_filename
from repository_store.ensemble import composing_models, is_ensemble
from repository_store.index import index_model, missing_model_files, resolve_ensembles
from repository_store.store import (
    CONFIG_FILENAME,
    FileInfo,
    LocalStore,
    RepositoryStore,
    is_version_name,
)
from repository_store.store import validate_model_name as _validate_name

#: boto3's default multipart threshold and part size (``TransferConfig``): files above it are
#: uploaded in parts of this size, and their ETag is the MD5 of the parts' MD5s, "-<parts>".
S3_PART_BYTES = 8 * 1024 * 1024
_MD5_ETAG = re.compile(r"^[0-9a-f]{32}(-[0-9]+)?$")

LoadCheck = Callable[[Path, ModelConfig], None]


class ModelFolderStore(LocalStore):
    """One local model folder seen as a repository that holds only it, as model ``name``
    (the folder's own name may differ). Symlinks are followed wherever they lead: deploy
    uploads the bytes they point to."""

    def __init__(self, folder: Path, name: str):
        super().__init__(folder.parent)
        self.folder, self.model_name = Path(os.path.abspath(folder)), name
        self.uri, self.real_root = str(self.folder), os.sep

    def list_models(self) -> list[str]:
        return [self.model_name]

    def model_exists(self, model: str) -> bool:
        return model == self.model_name and self.folder.is_dir()

    def _model_dir(self, model: str) -> Path:
        if model != self.model_name:
            raise ModelNotFound(f"model '{model}' is not in {self.uri}")
        return self.folder


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
                       load_check: LoadCheck | None = None,
                       repository: RepositoryStore | None = None) -> ModelFolder:
    """Check model folder ``path`` (served as ``name``, default: the folder's name) with the
    index's own code (:func:`repository_store.index.index_model` over the folder) plus the
    stricter checks of the module doc. An ensemble is also checked against the composing
    models ``repository`` holds now (:func:`repository_store.resolve_ensembles`, as the
    server's registry does), when given.

    :raises ConfigError: naming the first problem found.
    :raises RepositoryError: ``repository`` cannot be read.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder")
    name = _model_name(name or folder.resolve().name)
    versions, files, empty = _layout(folder)
    local = ModelFolderStore(folder, name)
    entry = index_model(local, name)
    if entry.config is None or not entry.ready:
        raise ConfigError(f"model '{name}': {entry.reason}")
    missing = missing_model_files(local, entry.config, versions)  # every version, not only those selected
    if missing:
        raise ConfigError(f"model '{name}': {missing[min(missing)]} ({folder / str(min(missing))})")
    if repository is not None and is_ensemble(entry.config):
        _check_ensemble(entry, repository)
    if load_check is not None and backend_of(entry.config) != "ensemble":
        for version in versions:
            _load(load_check, folder / str(version), entry.config, version)
    return ModelFolder(name, folder, entry.config, versions, files, empty)


def _check_ensemble(entry: ModelEntry, repository: RepositoryStore) -> None:
    """Refuse ensemble ``entry`` when the server would: its composing models (nested ones
    too) as ``repository`` holds them now, indexed, then :func:`resolve_ensembles`."""
    entries, todo = {entry.name: entry}, composing_models(entry.config)
    while todo:
        other = todo.pop()
        if other in entries or not repository.model_exists(other):
            continue
        entries[other] = index_model(repository, other)
        if is_ensemble(entries[other].config):
            todo.extend(composing_models(entries[other].config))
    resolved = resolve_ensembles(entries)[entry.name]
    if not resolved.ready:
        raise ConfigError(f"model '{entry.name}': {resolved.reason} (in {repository.uri})")


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
    """The files to upload, relative to ``folder``. A link that points outside the model
    folder is a :class:`ConfigError`: the upload would copy what it points to (a file of this
    machine) into the repository, and the server refuses links out of its repository too."""
    root = folder.resolve()
    for dirpath, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in [*dirs, *names]:
            _inside(Path(dirpath, name), root, folder)
        for filename in names:
            full = Path(dirpath, filename)
            if not filename.startswith(".") and full.is_file():
                yield full.relative_to(folder).as_posix()


def _inside(path: Path, root: Path, folder: Path) -> None:
    if path.is_symlink() and not path.resolve().is_relative_to(root):
        raise ConfigError(f"{path.relative_to(folder)} in {folder} links outside the model folder "
                          f"(to {os.readlink(path)}): deploy would upload what it points to")  # fmt: skip


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
    present = {str(v) for v in store.list_versions(model.name)}  # an empty one (S3: its marker) too
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
