"""The explicit load's check (:class:`gateway.load_probe.LoadProbe`): real child processes
(``python -m workers.load_check``) loading real models from a local repository: a good ONNX
model and a Python model load (the version lands in the cache workers use); a corrupt or
truncated file, an ``initialize`` that raises, a crash and a hang each give the load error;
a backend whose framework is missing here is skipped."""

from __future__ import annotations

import asyncio
import shutil
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from gateway.load_probe import LoadProbe
from naiad.settings import Settings
from repository_store import index_model, open_store
from workers.load_check import check_entry

PYTHON_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def python_model(root: Path, name: str, initialize: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(PYTHON_CONFIG.replace("{name}", name))
    source = f"""
        import os, signal, sys, time
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                {initialize}

            def execute(self, requests):
                return [pb_utils.InferenceResponse([]) for _ in requests]
    """
    (root / name / "1" / "model.py").write_text(textwrap.dedent(source))


@pytest.fixture(scope="module")
def repository(tmp_path_factory, example_repository: Path) -> Path:
    root = tmp_path_factory.mktemp("probe") / "models"
    shutil.copytree(example_repository / "digits", root / "digits")
    for name, content in (("corrupt", b"\x00 not a model " * 8), ("truncated", None)):
        shutil.copytree(example_repository / "digits", root / name)
        config = root / name / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "digits"', f'name: "{name}"'))
        onnx = root / name / "1" / "model.onnx"
        onnx.write_bytes(content if content is not None else onnx.read_bytes()[:300])
    python_model(root, "chatty", "print('hello from initialize'); self.ready = True")
    python_model(root, "raises", "raise ValueError('weights file is missing')")
    python_model(root, "crashes", "os.kill(os.getpid(), signal.SIGSEGV)")
    python_model(root, "hangs", "time.sleep(60)")
    return root


def probe_of(repository: Path, tmp_path: Path, timeout_s: float = 60.0) -> LoadProbe:
    return LoadProbe(str(repository), tmp_path / "cache", 1 << 30, timeout_s)


def check(probe: LoadProbe, repository: Path, name: str) -> str | None:
    return asyncio.run(probe(index_model(open_store(str(repository)), name)))


@pytest.mark.parametrize("name", ["digits", "chatty"])
def test_a_model_that_loads_passes_and_is_cached(repository, tmp_path, name):
    probe = probe_of(repository, tmp_path)
    assert check(probe, repository, name) is None
    assert len(list((tmp_path / "cache").glob(f"*/{name}/1/model.*"))) == 1  # where workers look


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("corrupt", "unable to load model 'corrupt' version 1 (onnxruntime): "),
        ("truncated", "unable to load model 'truncated' version 1 (onnxruntime): "),
        ("raises", "failed to load model 'raises': initialize() raised ValueError: weights file is missing"),
        ("crashes", "failed to load model 'crashes': the load crashed (killed by signal 11)"),
    ],
)
def test_a_model_that_does_not_load_gives_the_load_error(repository, tmp_path, name, reason):
    assert check(probe_of(repository, tmp_path), repository, name).startswith(reason)


def test_a_load_that_hangs_is_killed_at_the_timeout(repository, tmp_path):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    reason = check(probe_of(repository, tmp_path, timeout_s=3), repository, "hangs")
    assert reason == "failed to load model 'hangs': the load did not finish within 3 s"
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_backend_whose_framework_is_missing_here_is_skipped(repository, tmp_path, monkeypatch):
    """A gateway-only image has no ONNX Runtime: the check says so instead of failing."""
    monkeypatch.setitem(sys.modules, "workers.backends.onnxruntime", None)  # its import fails
    entry = index_model(open_store(str(repository)), "corrupt")
    settings = Settings(model_repository=str(repository), cache_dir=tmp_path / "cache", device="cpu")
    assert check_entry(entry, settings) == "backend 'onnxruntime' is not installed here"


def test_a_child_gone_before_reading_its_request_is_a_crash_not_a_server_error(repository, tmp_path):
    """A child that exits at once, its stdin closed (under load the gateway's write may then
    meet a closed pipe: uvloop raises RuntimeError there), is tried twice and then reported
    as a crashed load: an answer, never an exception out of the probe (was a 500)."""
    from naiad import eventloop  # noqa: PLC0415 - the gateway's own loop (uvloop)

    gone = (sys.executable, "-c", "import os; os.close(0); os._exit(3)")
    probe = LoadProbe(str(repository), tmp_path / "cache", 1 << 30, 60.0, command=gone)
    entry = index_model(open_store(str(repository)), "digits")
    for _ in range(5):  # either order of the child's exit and the gateway's write
        reason = eventloop.run(probe(entry))
        assert reason is not None and "the load crashed (exit status 3)" in reason, reason


def test_a_closed_pipe_at_the_first_write_is_retried_then_reported(repository, tmp_path, monkeypatch, caplog):
    """The race the first test leaves to chance, forced: the gateway writes only after the
    child has exited and the loop has seen its stdin close (uvloop then raises
    RuntimeError "the handler is closed", the 500 seen under load): a second child is tried,
    and its loss is reported as the crash."""
    from naiad import eventloop  # noqa: PLC0415

    communicate = asyncio.subprocess.Process.communicate

    async def late(process, input=None):  # noqa: A002 - the stdlib's own parameter name
        await process.wait()
        await asyncio.sleep(0.05)
        return await communicate(process, input)

    monkeypatch.setattr(asyncio.subprocess.Process, "communicate", late)
    gone = (sys.executable, "-c", "import os; os.close(0); os._exit(3)")
    probe = LoadProbe(str(repository), tmp_path / "cache", 1 << 30, 60.0, command=gone)
    with caplog.at_level("WARNING", logger="gateway.load_probe"):
        reason = eventloop.run(probe(index_model(open_store(str(repository)), "digits")))
    assert reason is not None and "the load crashed (exit status 3)" in reason, reason
    assert "exited before reading its request" in reason
    assert caplog.text.count("trying a new child") == 1
