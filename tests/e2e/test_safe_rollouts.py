"""Last known good on a real ``naiad serve`` polling moto's S3 server, under load.

Bad uploads over models that serve traffic — a ``config.pbtxt`` that does not parse, a new
version whose ``model.onnx`` is corrupt, a new version of a Python model whose
``initialize`` raises — fail no request: what was serving keeps serving (Triton: "if the
reload fails for any reason the already loaded model will be unchanged and will remain
loaded", model_management.md), and the failure shows at once in the repository index
(per version), the ``naiad_model_load_failures_total`` counter, the log and ``naiad status``.
A worker killed meanwhile is replaced by one that loads what serves; a fixed upload then goes
live without a restart.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from naiad_harness import POLL_EVERY_SECOND, run_scenario, s3_repository, wait_for
from prom_text import parse

from gateway.status import status_snapshot

ENV = {"NAIAD_WARM_POOL_SIZE": "0"}

PY_CONFIG = """
name: "py"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
PY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.offset = float(args["model_version"])  # INIT

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + self.offset)]) for r in requests]
"""
GOOD_INIT = 'self.offset = float(args["model_version"])  # INIT'
FAILING_INIT = 'raise RuntimeError("initialize refuses to start")  # INIT'


@pytest.fixture
def repository(tmp_path: Path, example_repository: Path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(example_repository / "digits", root / "digits")
    (root / "py" / "1").mkdir(parents=True)
    (root / "py" / "config.pbtxt").write_text(PY_CONFIG)
    (root / "py" / "1" / "model.py").write_text(PY_MODEL)
    return root


class Load:
    """Requests without a version to ``digits`` and ``py`` in a loop, on one thread, until
    stopped; every answer's model version and every failure are kept."""

    def __init__(self, url: str):
        self.url, self.stopped = url, threading.Event()
        self.answers: list[tuple[str, str]] = []
        self.failures: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=60)
        digits = httpclient.InferInput("input", [1, 64], "FP32")
        digits.set_data_from_numpy(np.ones((1, 64), np.float32))
        x = httpclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.zeros((1, 1), np.float32))
        try:
            while not self.stopped.is_set():
                for model, inputs in (("digits", [digits]), ("py", [x])):
                    try:
                        result = client.infer(model, inputs)
                        self.answers.append((model, result.get_response()["model_version"]))
                    except Exception as exc:  # noqa: BLE001 - every failure is the finding
                        self.failures.append(f"{model}: {exc}")
        finally:
            client.close()

    def versions(self, model: str) -> list[str]:
        """The versions that answered ``model``'s requests; fails at the first failure."""
        assert not self.failures, self.failures[:5]
        return [version for name, version in self.answers if name == model]

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(60)


def rows(server, model: str) -> dict[str, dict]:
    client = httpclient.InferenceServerClient(server.url)
    try:
        index = client.get_model_repository_index()
        return {row.get("version", ""): row for row in index if row["name"] == model}
    finally:
        client.close()


def failures_counted(server, model: str) -> float:
    return parse(server.metrics()).get("naiad_model_load_failures_total", model=model)


def test_bad_uploads_under_load_fail_no_request(naiad_server, redis_url, s3_endpoint, s3_bucket, repository):
    uri, put = s3_repository(s3_endpoint, s3_bucket, repository, "rollouts/models")
    server = naiad_server(uri, redis_url=redis_url, extra_env=ENV, extra_args=POLL_EVERY_SECOND)
    load = Load(server.url)
    try:
        wait_for(lambda: load.versions("digits") and load.versions("py"), 60, "both models answering")

        # 1. A config.pbtxt that does not parse: the loaded config keeps serving.
        good_config = (repository / "digits" / "config.pbtxt").read_bytes()
        put("digits/config.pbtxt", b"this is { not a config")
        row = wait_for(lambda: rows(server, "digits")["1"].get("reason"), 30, "the failed reload")
        assert rows(server, "digits")["1"]["state"] == "READY"
        assert row.startswith("reload failed (still serving version 1)") and "does not parse" in row
        assert failures_counted(server, "digits") == 1
        assert "model 'digits' changed: READY reload failed" in server.log()

        # A worker killed now is replaced by one that loads the kept entry, not the broken file.
        [worker] = server.worker_processes("digits")
        worker.kill()
        wait_for(lambda: [p.pid for p in server.worker_processes("digits")] not in ([], [worker.pid]),
                 60, "a successor worker")  # fmt: skip
        served = len(load.versions("digits"))
        wait_for(lambda: len(load.versions("digits")) > served + 10, 60, "digits answered by the successor")

        # 2. A new version whose model file does not load: version 1 keeps serving.
        put("digits/config.pbtxt", good_config)
        put("digits/2/model.onnx", b"\x00 not a model " * 8)
        wait_for(lambda: "2" in rows(server, "digits"), 60, "version 2 in the index")
        digits = rows(server, "digits")
        assert (digits["1"]["state"], digits["2"]["state"]) == ("READY", "UNAVAILABLE")
        assert "unable to load model 'digits' version 2" in digits["2"]["reason"]

        # 3. A new Python version whose initialize raises: version 1 keeps serving.
        put("py/2/model.py", PY_MODEL.replace(GOOD_INIT, FAILING_INIT))
        wait_for(lambda: "2" in rows(server, "py"), 60, "py version 2 in the index")
        py = rows(server, "py")
        assert (py["1"]["state"], py["2"]["state"]) == ("READY", "UNAVAILABLE")
        assert "initialize refuses to start" in py["2"]["reason"]
        assert failures_counted(server, "py") == 1

        async def check_status(redis) -> None:
            snapshot = {row["name"]: row for row in (await status_snapshot(redis))["models"]}
            assert snapshot["py"]["versions"] == ["1"] and snapshot["py"]["load_failures"] == 1
            assert "initialize refuses to start" in snapshot["py"]["failed_versions"]["2"]
            assert snapshot["py"]["problem"].startswith("reload failed (still serving version 1)")

        run_scenario(redis_url, check_status)
        answered = len(load.answers)
        wait_for(lambda: len(load.answers) > answered + 10, 30, "requests still answered")
        assert set(load.versions("digits")) == {"1"} and set(load.versions("py")) == {"1"}

        # 4. The fixed upload goes live without a restart.
        put("py/2/model.py", PY_MODEL)
        wait_for(lambda: load.versions("py")[-1:] == ["2"], 60, "py version 2 serving")
        assert rows(server, "py") == {"2": {"name": "py", "version": "2", "state": "READY"}}
    finally:
        load.stop()
    assert not load.failures, load.failures[:5]
