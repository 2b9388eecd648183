"""Model repository locations: a local folder or an S3 bucket and prefix.

Accepted forms (Triton's ``--model-repository``, see Triton's ``model_repository.md``,
"Repository Locations" / "S3"):

- ``/abs/path``, ``relative/path``, ``file:///abs/path`` -> a local folder;
- ``s3://bucket/prefix`` -> S3 with boto3's standard configuration (``AWS_ENDPOINT_URL`` ...);
- ``s3://host:port/bucket/prefix`` -> S3 at ``http://host:port`` (Triton's explicit-endpoint
  form: the first segment holds a ``:`` followed by a numeric port).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from naiad.errors import RepositoryError

# S3 bucket naming rules (AWS "Bucket naming rules"), loosened to accept legacy names
# with upper case and underscores that older regions and S3-compatible stores allow.
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,61}[A-Za-z0-9]$")
_HOST = re.compile(r"^[A-Za-z0-9.-]+$")


@dataclass(frozen=True)
class RepositoryURI:
    """Where a repository lives. ``path`` is set for ``kind == 'local'`` (absolute);
    ``bucket``/``prefix``/``endpoint_url`` for ``kind == 's3'`` (prefix without leading or
    trailing ``/``, endpoint ``None`` for boto3's own configuration)."""

    kind: str
    path: str = ""
    bucket: str = ""
    prefix: str = ""
    endpoint_url: str | None = None


def parse_repository_uri(uri: str) -> RepositoryURI:
    """Parse a ``--model-repository`` value.

    :param uri: a path, ``file://`` URI or ``s3://[host:port/]bucket[/prefix]``.
    :returns: the :class:`RepositoryURI`.
    :raises RepositoryError: empty value, unknown scheme, missing/invalid bucket, bad port.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise RepositoryError("empty model repository location")
    uri = uri.strip()
    if uri.startswith("s3://"):
        return _parse_s3(uri[len("s3://") :])
    if uri.startswith("file://"):
        parsed = urlsplit(uri)
        if parsed.netloc not in ("", "localhost"):
            raise RepositoryError(f"file URI with a remote host is not supported: {uri!r}")
        return _local(unquote(parsed.path))
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", uri):
        raise RepositoryError(f"unsupported model repository scheme in {uri!r}")
    return _local(uri)


def _local(path: str) -> RepositoryURI:
    if not path or "\x00" in path:
        raise RepositoryError(f"invalid local repository path {path!r}")
    return RepositoryURI(kind="local", path=os.path.abspath(os.path.expanduser(path)))


def _parse_s3(rest: str) -> RepositoryURI:
    segments = [s for s in rest.split("/") if s]
    endpoint = None
    if segments and ":" in segments[0]:
        endpoint = _endpoint(segments.pop(0))
    if not segments:
        raise RepositoryError(f"no bucket in s3://{rest}")
    bucket = segments[0]
    if not _BUCKET.match(bucket):
        raise RepositoryError(f"invalid S3 bucket name {bucket!r}")
    prefix_parts = segments[1:]
    if any(part in (".", "..") for part in prefix_parts):
        raise RepositoryError(f"'.' or '..' in S3 prefix of s3://{rest}")
    return RepositoryURI(kind="s3", bucket=bucket, prefix="/".join(prefix_parts), endpoint_url=endpoint)


def _endpoint(netloc: str) -> str:
    host, _, port = netloc.rpartition(":")
    if not host or not _HOST.match(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise RepositoryError(f"invalid S3 endpoint {netloc!r}: expected host:port")
    return f"http://{host}:{port}"
