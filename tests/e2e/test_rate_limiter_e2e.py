"""Triton's rate limiter with real workers: two Python-backend models whose instance groups
share resource ``R`` (1 copy on the machine) behind a real ``naiad serve``.

Each model's ``execute`` marks itself running (a file), waits up to the request's seconds for
the other model's mark (a negative wait: while the test's ``hold`` file exists), logs its
start and end, and answers whether it saw the other one running. One that saw the other keeps
its mark 0.5 s longer: removed at once, it could come and go between two 5 ms polls of the
other, which then waited its whole 60 s (the flake of stop 14's last run). With ``--rate-limit
execution_count`` the two never run at once; with ``--rate-limit off`` (the default, as in
Triton) they do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from naiad_harness import run_server, wait_for
from tritonclient.utils import InferenceServerException

MODEL_PY = '''
import json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        self.folder = config["parameters"]["marker_dir"]["string_value"]

    def _others_running(self):
        return any(f.endswith(".running") and f != self.name + ".running" for f in os.listdir(self.folder))

    def execute(self, requests):
        wait_s = float(pb_utils.get_input_tensor_by_name(requests[0], "WAIT_S").as_numpy()[0])
        mine = os.path.join(self.folder, self.name + ".running")
        open(mine, "w").close()
        start, saw = time.time(), False
        hold = os.path.join(self.folder, "hold")
        while wait_s < 0 and os.path.exists(hold) and time.time() < start + 120:  # held by the test
            time.sleep(0.005)
        while time.time() < start + wait_s and not saw:
            saw = self._others_running()
            time.sleep(0.005)
        end = time.time()
        if saw:  # keep the mark a while: the other, between two polls, must see it too
            time.sleep(0.5)
        os.remove(mine)
        with open(os.path.join(self.folder, "log"), "a") as log:
            log.write(f"{self.name} {start} {end}\\n")
        out = pb_utils.Tensor("SAW_OTHER", np.array([saw], dtype=np.bool_))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
'''

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "WAIT_S" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "SAW_OTHER" data_type: TYPE_BOOL dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 rate_limiter {{ resources [ {{ name: "R" count: 1 }} ] }} }} ]
parameters {{ key: "marker_dir" value {{ string_value: "{markers}" }} }}
"""


def repository(root: Path) -> tuple[Path, Path]:
    markers = root / "markers"
    markers.mkdir(parents=True)
    for name in ("first", "second"):
        (root / "models" / name / "1").mkdir(parents=True)
        (root / "models" / name / "config.pbtxt").write_text(CONFIG.format(name=name, markers=markers))
        (root / "models" / name / "1" / "model.py").write_text(MODEL_PY)
    return root / "models", markers


def run_both(client: httpclient.InferenceServerClient, wait_s: float) -> dict[str, bool]:
    """One request to each model at once (``async_infer``): whether each saw the other running."""
    tensor = httpclient.InferInput("WAIT_S", [1], "FP32")
    tensor.set_data_from_numpy(np.array([wait_s], np.float32))
    calls = {model: client.async_infer(model, [tensor]) for model in ("first", "second")}
    results = {model: call.get_result(timeout=120) for model, call in calls.items()}
    return {model: bool(result.as_numpy("SAW_OTHER")[0]) for model, result in results.items()}


def intervals(markers: Path) -> list[tuple[str, float, float]]:
    rows = [line.split() for line in (markers / "log").read_text().splitlines()]
    return [(name, float(start), float(end)) for name, start, end in rows]


@pytest.mark.parametrize("mode", ["execution_count", "off"])
def test_models_sharing_one_copy_never_run_at_once_unless_the_limiter_is_off(tmp_path, mode):
    models, markers = repository(tmp_path)
    args = ["--rate-limit", mode]
    with run_server(models, tmp_path / "serve", extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url, network_timeout=120, concurrency=2)
        try:
            assert run_both(client, 0.0) == {"first": False, "second": False}  # both workers warm
            # Limited, each waits its whole 2 s alone; off, each sees the other at once.
            saw = run_both(client, 2.0 if mode == "execution_count" else 60.0)
        finally:
            client.close()
        log = server.log()
    if mode == "execution_count":
        assert saw == {"first": False, "second": False}
        runs = sorted(intervals(markers), key=lambda run: run[1])
        assert len(runs) == 4
        for (_, _, end), (_, start, _) in zip(runs, runs[1:], strict=False):
            assert end <= start, f"two batches overlapped: {runs}"
        assert log.count("0/R x1 of 1, priority 1") == 2, log  # each worker, pooled or bare
    else:
        assert saw == {"first": True, "second": True}
        assert "rate limited on" not in log


def test_a_worker_killed_holding_the_copy_frees_it_after_its_lease(tmp_path):
    models, markers = repository(tmp_path)
    with run_server(models, tmp_path / "serve", extra_args=["--rate-limit", "execution_count"]) as server:
        client = httpclient.InferenceServerClient(server.url, network_timeout=120, concurrency=2)
        try:
            run_both(client, 0.0)
            (markers / "hold").touch()
            tensor = httpclient.InferInput("WAIT_S", [1], "FP32")
            tensor.set_data_from_numpy(np.array([-1.0], np.float32))
            held = client.async_infer("first", [tensor], timeout=5_000_000)  # µs
            wait_for(lambda: (markers / "first.running").exists(), 60, "first to run, holding R")
            [worker] = server.worker_processes("first")
            worker.kill()  # SIGKILL: no release; its lease (5 s) must give R back
            worker.wait(30)
            (markers / "hold").unlink()
            (markers / "first.running").unlink()  # the dead process's mark
            tensor.set_data_from_numpy(np.array([0.0], np.float32))
            assert client.infer("second", [tensor]).as_numpy("SAW_OTHER")[0] == np.False_
            with pytest.raises(InferenceServerException):  # past its 5 s timeout, or lost with its worker
                held.get_result(timeout=120)
        finally:
            client.close()
    assert [name for name, _, _ in intervals(markers)][-1] == "second"


def test_a_count_below_the_groups_need_makes_the_model_unavailable_with_tritons_reason(tmp_path):
    models, _ = repository(tmp_path)
    args = ["--rate-limit", "execution_count", "--rate-limit-resource", "R:0"]
    with run_server(models, tmp_path / "serve", extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url, network_timeout=120)
        try:
            tensor = httpclient.InferInput("WAIT_S", [1], "FP32")
            tensor.set_data_from_numpy(np.array([0.0], np.float32))
            with pytest.raises(InferenceServerException) as failed:
                client.infer("first", [tensor])
            reason = 'Resource count for "R" is limited to 0 which will prevent scheduling'
            assert reason in failed.value.message()
            index = {m["name"]: m for m in client.get_model_repository_index()}
            assert index["first"]["state"] == "UNAVAILABLE" and reason in index["first"]["reason"]
            assert not client.is_model_ready("first")
        finally:
            client.close()
