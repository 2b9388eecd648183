"""Reading a Triton-layout model repository from a local folder or an S3 bucket.

Layout (Triton ``model_repository.md``, "Repository Layout")::

    <root>/<model>/config.pbtxt
    <root>/<model>/<version>/<files...>

Every method validates the model name first (:func:`validate_model_name`), so a name sent by
a client can never reach outside the repository root. Failures of the store itself (missing
folder or bucket, network, permissions) become :class:`RepositoryError` with a short message.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import hashlib
import os
import pathlib
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from naiad.errors import ConfigError, ModelNotFound, RepositoryError
from repository_store.uri import parse_repository_uri

CONFIG_FILENAME = "config.pbtxt"
MAX_NAME_LENGTH = 255
# Triton: "Any subdirectories that are not numerically named, or have names that start with
# zero (0) will be ignored" (model_repository.md, "Repository Layout").
_VERSION = re.compile(r"^[1-9][0-9]*$")
_FORBIDDEN = ("/", "\\", "..", "{", "}", "\x00")


@dataclass(frozen=True)
class FileInfo:
    """One file of a version folder: ``path`` relative to it ('/'-separated), its size in
    bytes and an ``etag`` that changes when the content does (S3 ETag without quotes; for
    local files ``f"{mtime_ns}-{size}"``)."""

    path: str
    size: int
    etag: str


def validate_model_name(name: str) -> str:
    """Return ``name`` if it is a safe model name, else raise :class:`ModelNotFound`.

    Rejected: empty, over 255 characters, a leading '.', or containing '/', '\\\\', '..',
    '{', '}' (reserved for Redis hash tags), NUL or other control characters.
    """
    if not isinstance(name, str) or not name:
        raise ModelNotFound("empty model name")
    bad = (
        len(name) > MAX_NAME_LENGTH
        or name.startswith(".")
        or any(token in name for token in _FORBIDDEN)
        or any(ord(ch) < 32 or ord(ch) == 127 for ch in name)
    )
    if bad:
        raise ModelNotFound(f"invalid model name {name[:64]!r}")
    return name


def _validate_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ModelNotFound(f"invalid model version {version!r}")
    return version


class UnsafeModelFile(ConfigError):
    """A model folder holds something that would reach outside the repository: a symlink
    whose target is outside the root, or an S3 key with ``..``, an empty or absolute part.
    A :class:`ConfigError`, so the index marks that one model UNAVAILABLE with this reason."""


def validate_relpath(path: str) -> list[str]:
    """The '/'-separated parts of a path inside a model or version folder; raises
    :class:`RepositoryError` for an empty, absolute, ``.``/``..`` or NUL-holding path."""
    return _validate_relpath(path)


def _checked_listing(infos: list[FileInfo], where: str) -> list[FileInfo]:
    """``infos`` if every path is a safe relative path, else :class:`UnsafeModelFile`."""
    for info in infos:
        try:
            _validate_relpath(info.path)
        except RepositoryError:
            raise UnsafeModelFile(f"{where} holds an unsafe object key {info.path[:80]!r}") from None
    return infos


def _validate_relpath(path: str) -> list[str]:
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") or "\x00" in p for p in parts):
        raise RepositoryError(f"invalid file path {path!r} in a version folder")
    return parts


def is_version_name(name: str) -> bool:
    """True for a folder name Triton treats as a version (digits, no leading zero)."""
    return bool(_VERSION.match(name))


def _is_model_name(name: str) -> bool:
    try:
        validate_model_name(name)
    except ModelNotFound:
        return False
    return True


class RepositoryStore(abc.ABC):
    """A model repository. ``uri`` names it; ``cache_identity`` (``uri`` plus anything else
    that tells two repositories apart, e.g. the S3 endpoint) keys the download cache."""

    uri: str

    @property
    def cache_identity(self) -> str:
        return self.uri

    @abc.abstractmethod
    def check(self) -> None:
        """Raise :class:`RepositoryError` if the repository cannot be reached."""

    @abc.abstractmethod
    def list_models(self) -> list[str]:
        """Sorted names of the folders directly under the root that are valid model names."""

    @abc.abstractmethod
    def list_versions(self, model: str) -> list[int]:
        """Version numbers of ``model`` (numeric subfolders), ascending; others ignored."""

    def read_config(self, model: str) -> bytes | None:
        """``<model>/config.pbtxt`` contents, or ``None`` when it is absent."""
        return self.read_model_file(model, CONFIG_FILENAME)

    @abc.abstractmethod
    def read_model_file(self, model: str, filename: str) -> bytes | None:
        """A file of the model folder (``config.pbtxt``, a label file), or ``None`` when it
        is absent. Raises :class:`RepositoryError` for a path leaving the folder."""

    @abc.abstractmethod
    def list_version_files(self, model: str, version: int) -> list[FileInfo]:
        """Every file under ``<model>/<version>/``, sorted by path; [] if none."""

    @abc.abstractmethod
    def fetch_file(self, model: str, version: int, path: str, dest: pathlib.Path) -> None:
        """Write ``<model>/<version>/<path>`` to ``dest`` (parents created)."""

    @abc.abstractmethod
    def model_exists(self, model: str) -> bool:
        """True when a folder named ``model`` exists under the root."""

    @abc.abstractmethod
    def list_model_files(self, model: str) -> list[FileInfo]:
        """Every file under ``<model>/`` (config, labels, version files), paths relative to
        the model folder, sorted; [] for an absent model. Folder markers are not files."""

    @abc.abstractmethod
    def fingerprints(self) -> dict[str, str]:
        """Every model folder's fingerprint, from **one** listing of the whole repository
        (local: one walk with ``stat``; S3: ``list_objects_v2`` paged over the prefix): a hex
        digest of the sorted (path, ETag, size) list of everything under the folder, so it
        changes when any file (or empty folder) is added, removed or rewritten. Keys are the
        names :meth:`list_models` returns."""

    @abc.abstractmethod
    def put_file(
        self, model: str, path: str, source: pathlib.Path, progress: Callable[[int], None] | None = None
    ) -> None:
        """Write local file ``source`` to ``<model>/<path>``, whole or not at all (a reader
        never sees part of it); ``progress(n)`` is called with each chunk's byte count. A
        local repository keeps the source's modification time."""

    @abc.abstractmethod
    def make_folder(self, model: str, path: str) -> None:
        """Create the (empty) folder ``<model>/<path>/`` (on S3, a ``path/`` marker object),
        e.g. an ensemble's version folder that holds no file."""


class LocalStore(RepositoryStore):
    """A repository in a local folder."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = pathlib.Path(os.path.abspath(root))
        self.uri = str(self.root)
        #: The root with symlinks resolved: every file served must resolve inside it.
        self.real_root = os.path.realpath(self.root)

    def __repr__(self) -> str:
        return f"LocalStore({self.uri!r})"

    def check(self) -> None:
        if not self.root.is_dir():
            raise RepositoryError(f"model repository {self.uri} is not a readable folder")
        with _os_errors(f"reading {self.uri}"):
            os.listdir(self.root)

    def list_models(self) -> list[str]:
        with _os_errors(f"listing {self.uri}"):
            names = [e.name for e in os.scandir(self.root) if e.is_dir()]
        return sorted(n for n in names if _is_model_name(n))

    def list_versions(self, model: str) -> list[int]:
        folder = self._model_dir(model)
        if not folder.is_dir():
            return []
        with _os_errors(f"listing model {model}"):
            names = [e.name for e in os.scandir(folder) if e.is_dir()]
        return sorted(int(n) for n in names if is_version_name(n))

    def read_model_file(self, model: str, filename: str) -> bytes | None:
        path = self._model_dir(model).joinpath(*_validate_relpath(filename))
        self._contained(path, f"{model}/{filename}")
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise RepositoryError(f"cannot read {model}/{filename}: {reason}") from None

    def list_version_files(self, model: str, version: int) -> list[FileInfo]:
        folder = self._model_dir(model) / str(_validate_version(version))
        if not folder.is_dir():
            return []
        with _os_errors(f"listing {model}/{version}"):
            return sorted(_walk(folder, root=self.real_root), key=lambda info: info.path)

    def fetch_file(self, model: str, version: int, path: str, dest: pathlib.Path) -> None:
        source = self._model_dir(model) / str(_validate_version(version))
        source = source.joinpath(*_validate_relpath(path))
        self._contained(source, f"{model}/{version}/{path}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        with _os_errors(f"copying {model}/{version}/{path}"):
            shutil.copyfile(source, dest)

    def model_exists(self, model: str) -> bool:
        return self._model_dir(model).is_dir()

    def list_model_files(self, model: str) -> list[FileInfo]:
        folder = self._model_dir(model)
        if not folder.is_dir():
            return []
        with _os_errors(f"listing {model}"):
            return sorted(_walk(folder, root=self.real_root), key=lambda info: info.path)

    def fingerprints(self) -> dict[str, str]:
        with _os_errors(f"listing {self.uri}"):
            if not self.root.is_dir():
                raise RepositoryError(f"model repository {self.uri} is not a readable folder")
            models = [e.name for e in os.scandir(self.root) if e.is_dir() and _is_model_name(e.name)]
            return {name: _fingerprint(self.root / name, self.real_root) for name in sorted(models)}

    def put_file(
        self, model: str, path: str, source: pathlib.Path, progress: Callable[[int], None] | None = None
    ) -> None:
        dest = self._model_dir(model).joinpath(*_validate_relpath(path))
        aside = dest.with_name(f".{dest.name}.naiad-upload")
        with _os_errors(f"writing {model}/{path}"):
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(source, "rb") as reader, open(aside, "wb") as writer:
                while chunk := reader.read(1 << 20):
                    writer.write(chunk)
                    if progress is not None:
                        progress(len(chunk))
            stat = source.stat()  # keep the mtime: rsync's quick check (size, mtime) finds it unchanged
            os.utime(aside, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            os.replace(aside, dest)  # atomic: a poll sees the old file or the whole new one

    def make_folder(self, model: str, path: str) -> None:
        with _os_errors(f"creating {model}/{path}"):
            self._model_dir(model).joinpath(*_validate_relpath(path)).mkdir(parents=True, exist_ok=True)

    def _model_dir(self, model: str) -> pathlib.Path:
        """The model's folder; :class:`RepositoryError` if the root itself is gone."""
        folder = self.root / validate_model_name(model)
        if not self.root.is_dir():
            raise RepositoryError(f"model repository {self.uri} is not a readable folder")
        self._contained(folder, model)
        return folder

    def _contained(self, path: pathlib.Path, what: str) -> None:
        """:class:`UnsafeModelFile` unless ``path`` (symlinks resolved) is inside the root:
        a symlink in the repository may point elsewhere inside it, never out of it."""
        if os.path.lexists(path) and not _inside(os.path.realpath(path), self.real_root):
            raise UnsafeModelFile(f"{what} is a symlink that leads outside the model repository")


def _inside(real: str, real_root: str) -> bool:
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def _walk(folder: pathlib.Path, folders: bool = False, root: str | None = None) -> Iterator[FileInfo]:
    """Files under ``folder`` (and, with ``folders``, each empty subfolder as ``path/``).

    Symlinks are followed, but with ``root`` (a resolved path) one that leads outside it is
    :class:`UnsafeModelFile`, and a folder reached twice (a symlink loop) is walked once."""
    seen: set[str] = set()
    for dirpath, dirs, files in os.walk(folder, followlinks=True):
        if root is not None:
            real = os.path.realpath(dirpath)
            if not _inside(real, root):
                raise UnsafeModelFile(f"{dirpath} is a symlink that leads outside the model repository")
            if real in seen:
                dirs[:] = []
                continue
            seen.add(real)
        if folders and not dirs and not files and dirpath != str(folder):
            rel = pathlib.Path(dirpath).relative_to(folder).as_posix()
            yield FileInfo(path=rel + "/", size=0, etag="")
        for filename in files:
            if filename.endswith(".naiad-upload"):  # a deploy's file not yet in place
                continue
            full = pathlib.Path(dirpath, filename)
            try:
                stat = full.stat()
            except FileNotFoundError:  # a dangling symlink: not a file of the model
                continue
            if root is not None and not _inside(os.path.realpath(full), root):
                raise UnsafeModelFile(f"{full} is a symlink that leads outside the model repository")
            rel = full.relative_to(folder).as_posix()
            yield FileInfo(path=rel, size=stat.st_size, etag=f"{stat.st_mtime_ns}-{stat.st_size}")


def _fingerprint(folder: pathlib.Path, root: str) -> str:
    """A local model folder's fingerprint; one holding an escaping symlink gets a fixed one
    (its index entry says why it is unavailable)."""
    try:
        return _digest(list(_walk(folder, folders=True, root=root)))
    except UnsafeModelFile:
        return "unsafe"


def _digest(infos: Iterable[FileInfo]) -> str:
    """Fingerprint of a model folder: SHA-256 of its sorted (path, etag, size) lines."""
    lines = sorted(f"{info.path}\0{info.etag}\0{info.size}" for info in infos)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


@contextlib.contextmanager
def _os_errors(what: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        raise RepositoryError(f"{what} failed: {reason}") from None


class S3Store(RepositoryStore):
    """A repository under ``s3://bucket/prefix``, read with boto3.

    Credentials, region and (when ``endpoint_url`` is None) the endpoint come from boto3's
    standard configuration (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL`` ...).
    """

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        import boto3  # noqa: PLC0415 - imported by S3 repositories only (~0.1 s off every cold start)
        import botocore.config  # noqa: PLC0415

        config = botocore.config.Config(
            connect_timeout=5, read_timeout=60, retries={"max_attempts": 3, "mode": "standard"}
        )
        with _s3_errors(self, "creating the S3 client"):
            self.client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r}, endpoint_url={self.endpoint_url!r})"

    @property
    def cache_identity(self) -> str:
        return f"{self.uri}@{self.client.meta.endpoint_url}"

    def check(self) -> None:
        try:
            with _s3_errors(self, "reaching the bucket"):
                self.client.head_bucket(Bucket=self.bucket)
        except _NoSuchKey:
            raise RepositoryError(f"S3 bucket '{self.bucket}' does not exist") from None

    def list_models(self) -> list[str]:
        return sorted(n for n in self._subfolders(self._key()) if _is_model_name(n))

    def list_versions(self, model: str) -> list[int]:
        names = self._subfolders(self._key(validate_model_name(model)))
        return sorted(int(n) for n in names if is_version_name(n))

    def read_model_file(self, model: str, filename: str) -> bytes | None:
        key = self._key(validate_model_name(model), *_validate_relpath(filename))
        try:
            with _s3_errors(self, f"reading {model}/{filename}"):
                return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except _NoSuchKey:
            return None

    def list_version_files(self, model: str, version: int) -> list[FileInfo]:
        folder = self._key(validate_model_name(model), str(_validate_version(version))) + "/"
        infos = [
            FileInfo(path=obj["Key"][len(folder) :], size=obj["Size"], etag=obj["ETag"].strip('"'))
            for obj in self._objects(folder)
            if not obj["Key"].endswith("/")
        ]
        return sorted(_checked_listing(infos, f"{model}/{version}"), key=lambda info: info.path)

    def fetch_file(self, model: str, version: int, path: str, dest: pathlib.Path) -> None:
        parts = _validate_relpath(path)
        key = self._key(validate_model_name(model), str(_validate_version(version)), *parts)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            with _s3_errors(self, f"downloading {model}/{version}/{path}"):
                self.client.download_file(self.bucket, key, str(dest))
        except _NoSuchKey:
            raise RepositoryError(f"{model}/{version}/{path} vanished from {self.uri}") from None

    def model_exists(self, model: str) -> bool:
        folder = self._key(validate_model_name(model)) + "/"
        with _s3_errors(self, f"looking up {model}"):
            reply = self.client.list_objects_v2(Bucket=self.bucket, Prefix=folder, MaxKeys=1)
        return reply.get("KeyCount", 0) > 0

    def list_model_files(self, model: str) -> list[FileInfo]:
        folder = self._key(validate_model_name(model)) + "/"
        infos = [_info(obj, folder) for obj in self._objects(folder) if not obj["Key"].endswith("/")]
        return sorted(_checked_listing(infos, model), key=lambda info: info.path)

    def fingerprints(self) -> dict[str, str]:
        root = self._key() + "/" if self.prefix else ""
        grouped: dict[str, list[FileInfo]] = {}
        for obj in self._objects(root):
            name, sep, _rest = obj["Key"][len(root) :].partition("/")
            if sep and _is_model_name(name):
                grouped.setdefault(name, []).append(_info(obj, f"{root}{name}/"))
        return {name: _digest(infos) for name, infos in sorted(grouped.items())}

    def put_file(
        self, model: str, path: str, source: pathlib.Path, progress: Callable[[int], None] | None = None
    ) -> None:
        key = self._key(validate_model_name(model), *_validate_relpath(path))
        with _s3_errors(self, f"uploading {model}/{path}"):
            self.client.upload_file(str(source), self.bucket, key, Callback=progress)

    def make_folder(self, model: str, path: str) -> None:
        key = self._key(validate_model_name(model), *_validate_relpath(path)) + "/"
        with _s3_errors(self, f"creating {model}/{path}/"):
            self.client.put_object(Bucket=self.bucket, Key=key, Body=b"")

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def _subfolders(self, key: str) -> list[str]:
        folder = f"{key}/" if key else ""
        names = []
        for page in self._pages(Prefix=folder, Delimiter="/"):
            prefixes = page.get("CommonPrefixes", [])
            names += [p["Prefix"][len(folder) :].rstrip("/") for p in prefixes]
        return names

    def _objects(self, folder: str) -> Iterator[dict]:
        for page in self._pages(Prefix=folder):
            yield from page.get("Contents", [])

    def _pages(self, **kwargs: str) -> Iterator[dict]:
        paginator = self.client.get_paginator("list_objects_v2")
        with _s3_errors(self, f"listing {kwargs.get('Prefix') or '/'}"):
            yield from paginator.paginate(Bucket=self.bucket, **kwargs)


def _info(obj: dict, folder: str) -> FileInfo:
    """A listed S3 object as a :class:`FileInfo` relative to ``folder``."""
    return FileInfo(path=obj["Key"][len(folder) :], size=obj["Size"], etag=obj["ETag"].strip('"'))


class _NoSuchKey(RepositoryError):
    """Internal: the object is absent (callers decide whether that is an error)."""

    def __init__(self) -> None:
        super().__init__("no such object")


_MISSING_KEY_CODES = {"NoSuchKey", "404", "NotFound"}


@contextlib.contextmanager
def _s3_errors(store: S3Store, what: str) -> Iterator[None]:
    import botocore.exceptions  # noqa: PLC0415 - only S3 stores get here, after S3Store imported it

    try:
        yield
    except botocore.exceptions.ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "unknown"))
        if code == "NoSuchBucket":
            raise RepositoryError(f"S3 bucket '{store.bucket}' does not exist") from None
        if code in _MISSING_KEY_CODES:
            raise _NoSuchKey() from None
        message = error.get("Message") or code
        raise RepositoryError(f"{what} in {store.uri} failed: {code}: {message}") from None
    except botocore.exceptions.BotoCoreError as exc:
        raise RepositoryError(f"{what} in {store.uri} failed: {exc}") from None


def open_store(uri: str) -> RepositoryStore:
    """The store for a ``--model-repository`` value (see :func:`parse_repository_uri`).

    Does not contact the store; call :meth:`RepositoryStore.check` for that.
    :raises RepositoryError: for an invalid URI.
    """
    location = parse_repository_uri(uri)
    if location.kind == "local":
        return LocalStore(location.path)
    return S3Store(location.bucket, location.prefix, location.endpoint_url)
