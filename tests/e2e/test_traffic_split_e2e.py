"""Traffic between versions on a real ``naiad serve`` polling moto's S3 server: a weighted
split (``naiad.traffic_split``) with sticky route keys, shadow copies
(``naiad.shadow_version``), and the automatic rollback of a failing canary
(``naiad.rollback_error_rate``), shared through Redis with a second gateway started after the
decision. Real Python-backend workers answer; tritonclient is the client."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from naiad_harness import POLL_EVERY_SECOND, run_scenario, s3_repository, wait_for
from prom_text import parse
from rich.console import Console
from tritonclient.utils import InferenceServerException

from gateway.status import render_table, status_snapshot

ENV = {"NAIAD_WARM_POOL_SIZE": "0"}
CONFIG = """
name: "ab"
backend: "python"
max_batch_size: 8
version_policy { all { } }
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = float(args["model_version"])

    def execute(self, requests):
        FAIL
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 0 + self.version)]) for r in requests]
"""


def parameters(**values: str) -> str:
    """``naiad.<key>`` parameters of a config.pbtxt."""
    return "".join(f'parameters {{ key: "naiad.{k}" value: {{ string_value: "{v}" }} }}\n'
                   for k, v in values.items())  # fmt: skip


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for version in (1, 2):
        (root / "ab" / str(version)).mkdir(parents=True)
        (root / "ab" / str(version) / "model.py").write_text(MODEL.replace("FAIL", "pass"))
    (root / "ab" / "config.pbtxt").write_text(CONFIG + parameters(traffic_split="1:70,2:30"))
    return root


def infer(client: httpclient.InferenceServerClient, route_key: str | None = None, version: str = "") -> str:
    """The version that answered (its output Y is the version number)."""
    x = httpclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.zeros((1, 1), np.float32))
    headers = {"Naiad-Route-Key": route_key} if route_key else None
    result = client.infer("ab", [x], model_version=version, headers=headers)
    assert result.get_response()["model_version"] == str(int(result.as_numpy("Y")[0, 0]))
    return result.get_response()["model_version"]


def applied(server, **values: str) -> bool:
    config = requests.get(f"{server.http}/v2/models/ab/config", timeout=5).json()
    got = {k.removeprefix("naiad."): v["string_value"] for k, v in config.get("parameters", {}).items()}
    return got == values


def test_split_shadow_and_rollback(naiad_server, redis_url, s3_endpoint, s3_bucket, repository):
    uri, put_object = s3_repository(s3_endpoint, s3_bucket, repository, "split/models")
    put = lambda key, body: put_object(f"ab/{key}", body)  # noqa: E731
    server = naiad_server(uri, redis_url=redis_url, extra_env=ENV, extra_args=POLL_EVERY_SECOND)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        # 1. A 70/30 split by weight; a request naming a version gets it; a route key sticks.
        counts = Counter(infer(client) for _ in range(300))
        assert abs(counts["2"] / 300 - 0.30) <= 0.10, counts  # 3.8 standard deviations
        assert {infer(client, version="2") for _ in range(10)} == {"2"}
        for key in (f"user-{i}" for i in range(12)):
            assert len({infer(client, key) for _ in range(4)}) == 1, key
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        x = grpcclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.zeros((1, 1), np.float32))
        answers = [grpc.infer("ab", [x], headers={"naiad-route-key": "user-3"}) for _ in range(4)]
        grpc_versions = {answer.get_response().model_version for answer in answers}
        grpc.close()
        assert grpc_versions == {infer(client, "user-3")}

        # 2. Shadow copies: every answer from version 1, a share copied to version 2.
        put("config.pbtxt", CONFIG + parameters(traffic_split="1:100", shadow_version="2:50"))
        shadow_config = {"traffic_split": "1:100", "shadow_version": "2:50"}
        wait_for(lambda: applied(server, **shadow_config), 30, "the shadow config")
        assert {infer(client) for _ in range(100)} == {"1"}
        shadowed = lambda: parse(server.metrics()).get(  # noqa: E731
            "naiad_shadow_requests_total", model="ab", version="2", outcome="success")
        wait_for(lambda: shadowed() >= 20, 30, "shadow copies answered")
        assert shadowed() <= 80  # 50 % of 100, answers discarded

        # 3. A canary that fails is rolled back automatically.
        put("2/model.py", MODEL.replace("FAIL", 'raise RuntimeError("canary broken")'))
        put("config.pbtxt", CONFIG + parameters(traffic_split="1:50,2:50", rollback_error_rate="0.2",
                                                rollback_min_requests="10"))  # fmt: skip
        wait_for(lambda: applied(server, traffic_split="1:50,2:50", rollback_error_rate="0.2",
                                 rollback_min_requests="10"), 30, "the canary config")  # fmt: skip
        failures = 0

        def rolled_back() -> bool:
            nonlocal failures
            try:
                infer(client)
            except InferenceServerException as exc:
                assert "canary broken" in str(exc)
                failures += 1
            return parse(server.metrics()).get("naiad_rollbacks_total", model="ab", version="2") == 1

        wait_for(rolled_back, 60, "the canary's rollback", interval_s=0)
        assert 3 <= failures <= 20
        wait_for(lambda: {infer(client) for _ in range(20)} == {"1"}, 10, "every request on version 1")
        index = {row["version"]: row for row in client.get_model_repository_index()}
        assert index["2"]["state"] == "READY" and index["2"]["reason"].startswith("rolled back automatically")
        assert "model 'ab' version 2 rolled back automatically" in server.log()

        async def check_status(redis) -> None:
            snapshot = await status_snapshot(redis)
            [row] = snapshot["models"]
            assert row["rolled_back"]["2"].startswith("rolled back automatically")
            one, two = row["version_rows"]
            assert (one["state"], one["weight"], one["share"], two["state"], two["weight"], two["share"]) == (
                "serving", 50, 100, "rolled back", 50, 0)  # fmt: skip
            assert two["failure"] == failures and two["error_ratio"] > 0 and one["avg_latency_ms"] > 0
            console = Console(file=io.StringIO(), width=300)
            console.print(render_table(snapshot))
            text = console.file.getvalue()
            assert "└ v2" in text and "rolled back 50%->0%" in text and "serving 50%->100%" in text

        run_scenario(redis_url, check_status)
        # 4. A gateway started after the decision routes around the version too.
        other = naiad_server(uri, redis_url=redis_url, command="gateway", extra_args=POLL_EVERY_SECOND)
        second = httpclient.InferenceServerClient(other.url, network_timeout=60)
        try:
            assert {infer(second) for _ in range(30)} == {"1"}
        finally:
            second.close()
    finally:
        client.close()
