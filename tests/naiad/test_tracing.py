"""naiad/tracing.py: spans gateway -> queue -> worker -> backend, the trace context carried
in the queue message (header ``tp``), and no opentelemetry import while tracing is off.

The gateway runs in this process with the SDK's in-memory exporter; the worker is a real
``naiad worker --trace`` process whose console exporter writes one JSON span a line to a file.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys

import aiohttp
import numpy as np
import pytest
from naiad_harness import free_port, wait_for

from naiad import tracing
from naiad.codec import decode_request, encode_request
from naiad.inference import InferRequest, Tensor
from naiad.settings import Settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _request(request_id: str = "") -> InferRequest:
    data = np.ones((1, 64), np.float32)
    return InferRequest("digits", 1, [Tensor("input", "FP32", [1, 64], data)], [], request_id)


def test_queue_header_carries_traceparent_and_log_id():
    fields = encode_request("q1", _request(), "reply", 10.0, 1.0, traceparent=TRACEPARENT, log_id="abc")
    queued = decode_request("digits", fields)
    assert queued.traceparent == TRACEPARENT and queued.request_id == "abc"


def test_queue_header_without_them_is_unchanged():
    queued = decode_request("digits", encode_request("q1", _request("client-id"), "reply", 10.0, 1.0))
    assert queued.traceparent is None and queued.request_id == "client-id"
    queued = decode_request("digits", encode_request("q2", _request(), "reply", 10.0, 1.0))
    assert queued.request_id == "q2"  # neither the client nor the gateway named it


def test_tracing_off_imports_no_opentelemetry():
    code = (
        "import sys, naiad_cli, gateway.server, workers.worker\n"
        "from naiad import tracing\nfrom naiad.settings import Settings\n"
        "assert tracing.setup(Settings(), 'naiad-test') is False\n"
        "with tracing.span('x') as s: assert s is None\n"
        "assert tracing.traceparent() is None\n"
        "ours = ('opentelemetry.sdk.trace', 'opentelemetry.trace.propagation.tracecontext')\n"
        "loaded = [m for m in sys.modules if m.startswith(ours)]\n"
        "assert not loaded, loaded\n"
    )  # (redis-py 8 itself imports opentelemetry's metrics API when it is installed)
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def _hex(value: int, width: int) -> str:
    return f"0x{value:0{width}x}"


def _worker_spans(path: pathlib.Path) -> dict[str, dict]:
    spans = {}
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith('{"name"'):
            span = json.loads(line)
            spans[span["name"]] = span
    return spans


async def _serve_one_request(settings: Settings, redis_url: str, start_worker) -> None:
    from gateway.server import run_gateway

    stop = asyncio.Event()
    gateway = asyncio.create_task(run_gateway(settings, redis_url, stop))
    base = f"http://127.0.0.1:{settings.http_port}"
    body = {"id": "traced-1", "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                                          "data": [1.0] * 64}]}  # fmt: skip
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(300):
                try:
                    async with session.get(f"{base}/v2/health/ready") as ready:
                        if ready.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.05)
            start_worker()  # after the gateway indexed the repository into Redis
            async with session.post(f"{base}/v2/models/digits/infer", json=body) as response:
                assert response.status == 200, await response.text()
                assert (await response.json())["id"] == "traced-1"
    finally:
        stop.set()
        await asyncio.wait_for(gateway, 30)


def test_spans_from_gateway_through_queue_to_worker(tmp_path, redis_url, example_repository):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    settings = Settings(
        model_repository=str(example_repository), http_host="127.0.0.1", http_port=free_port(),
        grpc_port=free_port(), metrics_port=free_port(), cache_dir=tmp_path / "cache",
    )
    log_path, workers = tmp_path / "worker.log", []

    def start_worker() -> None:
        command = [
            sys.executable, "-m", "naiad_cli", "worker", "--model", "digits", "--trace",
            "--model-repository", str(example_repository), "--redis-url", redis_url,
            "--cache-dir", str(tmp_path / "cache"), "--idle-timeout", "60",
        ]  # fmt: skip
        env = {**os.environ, "OTEL_TRACES_EXPORTER": "console", "PYTHONUNBUFFERED": "1"}
        with log_path.open("wb") as log:
            workers.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log))

    exporter = InMemorySpanExporter()
    tracing.setup(None, "naiad-gateway", exporter=exporter)
    try:
        asyncio.run(_serve_one_request(settings, redis_url, start_worker))
    finally:
        tracing.shutdown()
        for worker in workers:
            worker.terminate()
            worker.wait(15)

    gateway = {span.name: span for span in exporter.get_finished_spans()}
    infer, enqueue = gateway["naiad.infer"], gateway["naiad.enqueue"]
    assert infer.kind.name == "SERVER" and enqueue.kind.name == "PRODUCER"
    assert enqueue.parent.span_id == infer.context.span_id
    assert infer.attributes["naiad.model"] == "digits" and infer.attributes["naiad.request_id"] == "traced-1"
    assert infer.resource.attributes["service.name"] == "naiad-gateway"
    trace_id, enqueue_id = _hex(infer.context.trace_id, 32), _hex(enqueue.context.span_id, 16)

    spans = wait_for(lambda: _worker_spans(log_path).get("naiad.backend") and _worker_spans(log_path),
                     10, "the worker's spans")  # fmt: skip
    queue, batch, backend = spans["naiad.queue"], spans["naiad.batch"], spans["naiad.backend"]
    assert {s["context"]["trace_id"] for s in (queue, batch, backend)} == {trace_id}
    assert queue["parent_id"] == enqueue_id and batch["parent_id"] == enqueue_id
    assert batch["kind"] == "SpanKind.CONSUMER"
    assert [link["context"]["span_id"] for link in batch["links"]] == [enqueue_id]
    assert backend["parent_id"] == batch["context"]["span_id"]
    assert batch["attributes"]["naiad.request_ids"] == ["traced-1"]
    assert batch["resource"]["attributes"]["service.name"] == "naiad-worker"


def test_naiad_serve_trace_passes_tracing_to_its_workers(naiad_server):
    """``naiad serve --trace`` with the console exporter: the gateway's and the worker's
    spans (the worker started by the scaler) share one trace id in the server's output."""
    server = naiad_server(extra_args=["--trace"], extra_env={"OTEL_TRACES_EXPORTER": "console"})
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [2.0] * 64}]}
    import requests

    response = requests.post(f"{server.http}/v2/models/digits/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    spans = wait_for(lambda: (s := _worker_spans(server.log_path)).get("naiad.infer") and s, 10, "spans")
    assert spans["naiad.infer"]["resource"]["attributes"]["service.name"] == "naiad-serve"
    assert spans["naiad.batch"]["resource"]["attributes"]["service.name"] == "naiad-worker"
    assert spans["naiad.batch"]["context"]["trace_id"] == spans["naiad.infer"]["context"]["trace_id"]
    assert spans["naiad.batch"]["parent_id"] == spans["naiad.enqueue"]["context"]["span_id"]


@pytest.mark.parametrize("exporter", ["zipkin"])
def test_unknown_exporter_is_a_usage_error(exporter, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "naiad_cli", "worker", "--model", "m", "--redis-url", "redis://127.0.0.1:1",
         "--trace"],
        cwd=ROOT, env={**os.environ, "OTEL_TRACES_EXPORTER": exporter}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "OTEL_TRACES_EXPORTER" in result.stderr
