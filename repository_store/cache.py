"""The worker-side download cache: versions pulled from a repository onto local disk.

Layout under ``root`` (one machine, any number of processes)::

    <root>/<sha256(store identity)[:16]>/<model>/<version>/...     the version folder
    <root>/<sha256(store identity)[:16]>/<model>/<version>.json    manifest (FileInfo list);
                                                                  its mtime is the last use
    <root>/<sha256(store identity)[:16]>/<model>/<version>.lock    per-version file lock
    <root>/.evict.lock, <root>/.tmp/                              eviction lock, downloads

A version is complete exactly when its manifest exists: downloads go to a temp folder inside
``root``, every file's size (and MD5, when the ETag is a single-part MD5) is checked, the
folder is renamed into place with ``os.rename`` and then the manifest is written atomically.
A version whose listing in the store no longer matches its manifest is downloaded again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass

import filelock

from naiad.errors import ModelNotFound, RepositoryError
from repository_store.store import FileInfo, RepositoryStore, validate_model_name, validate_relpath

logger = logging.getLogger(__name__)

GIB = 1 << 30
_MD5_ETAG = re.compile(r"^[0-9a-f]{32}$")
_LOCK_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class PullStats:
    """What the last :meth:`ModelCache.ensure_version` did: whether it downloaded, how many
    bytes and how long the download took (0 when served from the cache)."""

    downloaded: bool
    bytes: int
    seconds: float


def verify_file(path: pathlib.Path, info: FileInfo) -> None:
    """Check a downloaded file against its listing: the size always, and the MD5 when the
    ETag is one (S3 single-part uploads without SSE-KMS; multipart ETags hold a '-').

    :raises RepositoryError: on a mismatch.
    """
    size = path.stat().st_size
    if size != info.size:
        raise RepositoryError(f"{info.path}: downloaded {size} bytes, expected {info.size}")
    if _MD5_ETAG.match(info.etag):
        digest = hashlib.md5(usedforsecurity=False)
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() != info.etag:
            raise RepositoryError(f"{info.path}: content does not match its ETag {info.etag}")


class ModelCache:
    """Local copies of model versions, shared safely by the processes of one machine.

    :param root: cache folder (created if missing).
    :param max_bytes: size cap; least recently used versions are evicted past it.
    :param verify_md5: compare MD5 ETags (turn off for stores whose ETags are 32-hex but not
        MD5, e.g. S3 objects encrypted with SSE-KMS).
    """

    def __init__(self, root: pathlib.Path, max_bytes: int = 10 * GIB, verify_md5: bool = True):
        self.root = pathlib.Path(root)
        self.max_bytes = max_bytes
        self.verify_md5 = verify_md5
        self.last_pull: PullStats | None = None
        (self.root / ".tmp").mkdir(parents=True, exist_ok=True)

    def version_dir(self, store: RepositoryStore, model: str, version: int) -> pathlib.Path:
        """Where ``ensure_version`` puts that version (whether present or not)."""
        key = hashlib.sha256(store.cache_identity.encode()).hexdigest()[:16]
        return self.root / key / validate_model_name(model) / str(int(version))

    def ensure_version(self, store: RepositoryStore, model: str, version: int) -> pathlib.Path:
        """Return the local folder of ``model``/``version``, downloading it if absent or stale.

        Sets :attr:`last_pull`, then evicts least recently used other versions while the
        cache exceeds ``max_bytes``. When the store cannot be listed but a complete copy is
        cached, that copy is returned (logged as a warning).
        :raises ModelNotFound: invalid name, or the version folder is empty or missing.
        :raises RepositoryError: the store fails or a file does not match its listing.
        """
        folder = self.version_dir(store, model, version)
        files = _listing(store, model, version, folder)
        if not files:
            raise ModelNotFound(f"version {version} of model '{model}' has no files")
        folder.parent.mkdir(parents=True, exist_ok=True)
        with self._lock(folder):
            if _read_manifest(folder) == files and folder.is_dir():
                self.last_pull = PullStats(False, 0, 0.0)
            else:
                self.last_pull = self._download(store, model, version, files, folder)
            _touch(_manifest_path(folder))
            self._evict(keep=folder)
        return folder

    def _download(
        self,
        store: RepositoryStore,
        model: str,
        version: int,
        files: list[FileInfo],
        folder: pathlib.Path,
    ) -> PullStats:
        start = time.monotonic()
        staging = pathlib.Path(tempfile.mkdtemp(prefix="pull-", dir=self.root / ".tmp"))
        try:
            for info in files:
                # Checked here too: a listing's path never leaves the staging folder.
                dest = staging.joinpath(*validate_relpath(info.path))
                store.fetch_file(model, version, info.path, dest)
                self._verify(dest, info)
            _manifest_path(folder).unlink(missing_ok=True)
            self._discard(folder)
            os.rename(staging, folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _write_manifest(folder, files)
        stats = PullStats(True, sum(f.size for f in files), time.monotonic() - start)
        logger.info("pulled %s/%s: %d bytes in %.3f s", model, version, stats.bytes, stats.seconds)
        return stats

    def _verify(self, path: pathlib.Path, info: FileInfo) -> None:
        if self.verify_md5:
            verify_file(path, info)
        else:
            verify_file(path, FileInfo(info.path, info.size, ""))

    def _evict(self, keep: pathlib.Path) -> None:
        with filelock.FileLock(self.root / ".evict.lock", timeout=_LOCK_TIMEOUT_S):
            entries = sorted(self._entries(), key=lambda e: e[0])
            total = sum(size for _, size, _ in entries)
            for _, size, folder in entries:
                if total <= self.max_bytes:
                    return
                if folder != keep and self._evict_one(folder):
                    total -= size

    def _entries(self) -> list[tuple[int, int, pathlib.Path]]:
        """(last use ns, bytes, folder) of every complete version in the cache."""
        entries = []
        for manifest in self.root.glob("*/*/*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                files = json.loads(manifest.read_text())
                size = sum(int(f["size"]) for f in files)
                entries.append((manifest.stat().st_mtime_ns, size, manifest.with_suffix("")))
        return entries

    def _evict_one(self, folder: pathlib.Path) -> bool:
        """Remove one version unless another process holds its lock now."""
        try:
            with self._lock(folder, timeout=0):
                _manifest_path(folder).unlink(missing_ok=True)
                self._discard(folder)
        except filelock.Timeout:
            return False
        logger.info("evicted %s from the model cache", folder)
        return True

    def _discard(self, folder: pathlib.Path) -> None:
        """Move ``folder`` out of the way atomically, then delete it."""
        if not folder.exists():
            return
        trash = pathlib.Path(tempfile.mkdtemp(prefix="old-", dir=self.root / ".tmp"))
        os.rename(folder, trash / "v")
        shutil.rmtree(trash, ignore_errors=True)

    @staticmethod
    def _lock(folder: pathlib.Path, timeout: float = _LOCK_TIMEOUT_S) -> filelock.FileLock:
        return filelock.FileLock(folder.with_name(folder.name + ".lock"), timeout=timeout)


def _listing(store: RepositoryStore, model: str, version: int, folder: pathlib.Path) -> list[FileInfo]:
    try:
        return store.list_version_files(model, version)
    except RepositoryError as exc:
        cached = _read_manifest(folder)
        if cached is None or not folder.is_dir():
            raise
        logger.warning("using the cached %s/%s: the repository failed: %s", model, version, exc)
        return cached


def _manifest_path(folder: pathlib.Path) -> pathlib.Path:
    return folder.with_name(folder.name + ".json")


def _read_manifest(folder: pathlib.Path) -> list[FileInfo] | None:
    try:
        return [FileInfo(**f) for f in json.loads(_manifest_path(folder).read_text())]
    except (OSError, ValueError, TypeError):
        return None


def _write_manifest(folder: pathlib.Path, files: list[FileInfo]) -> None:
    path = _manifest_path(folder)
    partial = path.with_name(path.name + ".part")
    partial.write_text(json.dumps([asdict(f) for f in files]))
    os.replace(partial, path)


def _touch(path: pathlib.Path) -> None:
    now = time.time_ns()
    os.utime(path, ns=(now, now))
