"""The load generator against a real floor server (ONNX Runtime in-process), and the report step.

The floor serves the benchmark's ``tiny`` model (an Identity node) built into a temp folder;
every run is about a second.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bench.perf import loadgen, report
from bench.perf.models import build_tiny
from bench.perf.servers import Server, start_floor


@pytest.fixture(scope="module")
def floor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("repo")
    build_tiny(repo)
    server = start_floor(repo, tmp_path_factory.mktemp("logs"), ["tiny"])
    try:
        yield server
    finally:
        server.stop()


def tiny_target(url: str, encoding: str = "binary", model: str = "tiny") -> loadgen.Target:
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    return loadgen.Target(
        url, model, (loadgen.Tensor("input", "FP32", data),), encoding=encoding, outputs=("output",)
    )


def check_point(point: dict, duration_s: float) -> None:
    lat = point["latency_ms"]
    assert point["requests"] > 0 and point["errors"] == 0, point
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"] <= lat["max"], lat
    assert point["throughput_rps"] == pytest.approx(point["requests"] / duration_s, rel=0.01)
    # A closed loop of c users completes at most c * window / mean latency requests inside the
    # window, plus one each whose request started before it (it counts by completion time).
    users = point.get("concurrency", 10**9)
    assert point["requests"] <= users * duration_s * 1000 / lat["avg"] * 1.05 + users
    assert point["client_cpu"] > 0


def test_floor_answers_like_triton(floor: Server) -> None:
    """The floor is a real v2 server: tritonclient's binary request, the identity comes back."""
    client = httpclient.InferenceServerClient(floor.http_url)
    x = np.random.default_rng(0).random((3, 16)).astype(np.float32)
    tensor = httpclient.InferInput("input", [3, 16], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("tiny", [tensor], outputs=[httpclient.InferRequestedOutput("output")])
    np.testing.assert_array_equal(result.as_numpy("output"), x)
    client.close()


def test_floor_answers_grpc_like_triton(floor: Server) -> None:
    """The floor's gRPC ModelInfer: tritonclient.grpc's request, the identity comes back; an
    unknown model is NOT_FOUND, a tensor that does not fit its shape INVALID_ARGUMENT."""
    client = grpcclient.InferenceServerClient(floor.grpc_url)
    x = np.random.default_rng(1).random((2, 16)).astype(np.float32)
    tensor = grpcclient.InferInput("input", [2, 16], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("tiny", [tensor], outputs=[grpcclient.InferRequestedOutput("output")])
    np.testing.assert_array_equal(result.as_numpy("output"), x)
    with pytest.raises(InferenceServerException, match="unknown model") as caught:
        client.infer("nope", [tensor])
    assert caught.value.status() == "StatusCode.NOT_FOUND"
    wrong = grpcclient.InferInput("input", [2, 16], "FP32")
    wrong.set_data_from_numpy(x)
    wrong._input.shape[:] = [3, 16]  # the shape says 48 elements, the bytes hold 32
    with pytest.raises(InferenceServerException, match="inference failed") as caught:
        client.infer("tiny", [wrong])
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    client.close()


@pytest.mark.parametrize("encoding", ["binary", "json"])
def test_concurrency_sweep(floor: Server, encoding: str) -> None:
    series = loadgen.run(
        lambda: loadgen.measure(
            tiny_target(floor.http_url, encoding),
            concurrency=[1, 4],
            warmup_s=0.1,
            duration_s=0.4,
            server_pids=[floor.pid],
        )
    )
    assert [p["concurrency"] for p in series["points"]] == [1, 4]
    for point in series["points"]:
        check_point(point, 0.4)
        assert point["server_cpu"] > 0  # the floor's own process did the work
    json.dumps(series)  # plain JSON, nothing numpy left


def test_cli_rate_mode_and_report(floor: Server, tmp_path: Path) -> None:
    """``python -m bench.perf.loadgen`` (metadata fetched, open loop) → JSON → Markdown + PNG."""
    out = tmp_path / "run.json"
    code = loadgen.main(
        [
            "-m",
            "tiny",
            "-u",
            floor.http_url,
            "--request-rate",
            "200",
            "--request-distribution",
            "constant",
            "--warmup",
            "0.1",
            "--duration",
            "0.5",
            "-f",
            str(out),
        ]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    (point,) = doc["series"][0]["points"]
    check_point(point, 0.5)
    assert point["mode"] == "rate" and point["dropped"] == 0
    assert 90 <= point["requests"] <= 110  # 200/s for 0.5 s, constant arrivals
    assert doc["series"][0]["target"]["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [1, 16]}]

    paths = report.write(doc, tmp_path / "report", "run")
    text = paths["md"].read_text()
    assert f"| tiny http | 200/s | {point['throughput_rps']:.0f} |" in text
    assert f"| {point['latency_ms']['p50']:.2f} |" in text
    png = paths["png"].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    assert json.loads(paths["json"].read_text()) == doc


def test_probe_reports_a_failing_model(floor: Server) -> None:
    with pytest.raises(loadgen.RequestError, match="HTTP 404"):
        loadgen.run(
            lambda: loadgen.measure(tiny_target(floor.http_url, model="missing"), probe_timeout_s=0.3)
        )


def test_chunked_bodies_split_anywhere() -> None:
    """The raw client's chunked decoder: incomplete input waits, complete input is consumed."""
    wire = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\nNEXT"
    for cut in range(len(wire) - 4):
        assert loadgen._take_chunked(bytearray(wire[:cut])) is None
    buf = bytearray(wire)
    assert loadgen._take_chunked(buf) == b"hello world"
    assert buf == b"NEXT"


def test_costs_of_naiad_count_its_processes_redis_and_batches(tmp_path: Path) -> None:
    """Against a real ``naiad serve`` (embedded Redis): each point's costs split the CPU by
    process kind, read the embedded Redis's counters (found through its unix socket) and
    count the batches of the statistics extension: every request ran in one of them."""
    from bench.perf.servers import running, start_naiad  # noqa: PLC0415

    repo = tmp_path / "repo"
    build_tiny(repo)
    with running(start_naiad(repo, tmp_path / "logs", ["tiny"])) as naiad:
        series = loadgen.run(lambda: loadgen.measure(
            tiny_target(naiad.http_url), concurrency=[2], warmup_s=0.2, duration_s=0.6,
            server_pids=[naiad.pid], stats_url=naiad.http_url))  # fmt: skip
    [point] = series["points"]
    costs = point["costs"]
    assert point["requests"] > 0 and point["errors"] == 0
    assert {"server", "redis-server", "worker"} <= set(costs["cpu_us_per_request"])
    assert all(v >= 0 for v in costs["cpu_us_per_request"].values())
    redis = costs["redis"]
    assert redis["commands_per_request"] > 0 and redis["commands_per_request"] >= redis["reads_per_request"]
    # by command (the statistics' writes at least); at most one entry a request, less those
    # handed to the idle worker directly (naiad.reply_channel): at c2 possibly all of them,
    # its offer renewed by each answer given within its read (workers.worker: Worker._run_now)
    assert redis["calls_per_request"] and redis["calls_per_request"].get("xadd", 0) <= 1.25
    batches = costs["batches"]
    rows = sum(int(size) * n for size, n in batches["by_size"].items())
    assert batches["executed"] >= 1 and rows == pytest.approx(point["requests"], rel=0.25)


def test_floor_runs_on_naiads_event_loop(floor):
    """The floor is the cheapest Python loop Naiad itself would run on: uvloop when installed."""
    pytest.importorskip("uvloop")
    mapped = {m.path for m in psutil.Process(floor.pid).memory_maps()}
    assert any("uvloop" in path for path in mapped), "the floor runs on asyncio's own loop"
