"""Shared fixtures: real servers on loopback, each started here and stopped when done.

- ``redis_url``: a private ``redis-server`` (the product's own :class:`EmbeddedRedis`).
- ``s3_endpoint``: moto's S3 server (``moto.server``) on a free loopback port, reached over
  HTTP with boto3 exactly as a real S3 endpoint would be.
- ``s3_bucket``: a fresh, empty bucket on that server.
"""

from __future__ import annotations

import pathlib
import sys

# tests/ is on sys.path (pytest's "prepend" import mode) and mirrors the packages with
# folders (gateway/, workers/, naiad/ ...) that would otherwise be imported as namespace
# packages ahead of the editable install: put the project root first so the real ones win.
_ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import os  # noqa: E402
import subprocess  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import boto3  # noqa: E402
import pytest  # noqa: E402
from naiad_harness import answers_http, free_port, wait_for  # noqa: E402

from naiad.redis_server import EmbeddedRedis  # noqa: E402

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def redis_url() -> Iterator[str]:
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a moto S3 server; also sets boto3's credentials env."""
    os.environ.update(S3_ENV)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers_http(endpoint), 60, f"moto's S3 server at {endpoint}")
        yield endpoint
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """Name of a new empty bucket on the moto server."""
    name = f"models-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


# --- end-to-end fixtures: the example repository and `naiad serve` processes ------------------

EXAMPLES = pathlib.Path(_ROOT) / "examples"


@pytest.fixture(scope="session")
def example_repository(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The example repository's ``digits`` and ``silero_vad``, built once per session with
    ``python examples/build_repository.py OUT_DIR --model ...`` exactly as a user would. The
    other example models (TorchScript, SavedModel, the ensemble) are left out: the tests that
    serve them build their own (e.g. tests/e2e/test_framework_backends.py)."""
    out = tmp_path_factory.mktemp("example") / "models"
    subprocess.run(
        [sys.executable, str(EXAMPLES / "build_repository.py"), str(out), "--model", "digits",
         "--model", "silero_vad"],
        check=True, capture_output=True, timeout=110,
    )
    return out


@pytest.fixture(scope="session")
def digits_holdout() -> tuple:
    """``(X float32 [360, 64], y int64 [360])`` from ``examples/digits_data.py``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("naiad_example_digits_data", EXAMPLES / "digits_data.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load_holdout()


@pytest.fixture(scope="session")
def digits_onnx(example_repository: pathlib.Path):
    """An onnxruntime session on the very file the server serves (the reference)."""
    import onnxruntime as ort

    path = example_repository / "digits" / "1" / "model.onnx"
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture
def naiad_server(tmp_path: pathlib.Path, example_repository: pathlib.Path):
    """Factory: ``naiad_server(repository=..., idle_timeout_s=..., redis_url=...)`` starts a
    ``naiad serve`` on free ports with a cache under tmp_path; each is stopped (SIGINT) at
    teardown, which also asserts that it left no worker or other child process behind."""
    from naiad_harness import start_server

    servers = []

    def start(repository=None, **kwargs):
        workdir = tmp_path / f"server{len(servers)}"
        server = start_server(repository or example_repository, workdir, **kwargs)
        servers.append(server)
        return server

    yield start
    errors = []
    for server in servers:
        try:
            server.stop()
        except AssertionError as exc:
            errors.append(str(exc))
    assert not errors, errors



# --- fuzzing: bounded by default, `--fuzz-long` or NAIAD_FUZZ=long for many more examples -------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz-long", action="store_true", default=False,
        help="run the fuzzers (hypothesis, schemathesis) with many more, random examples",
    )  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    # Read by tests/fuzzing.py when the test modules are imported (after this hook).
    if config.getoption("--fuzz-long"):
        os.environ["NAIAD_FUZZ"] = "long"
