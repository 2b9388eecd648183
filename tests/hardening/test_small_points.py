"""Issue 17, finding 6: deep JSON, non-finite outputs, header floods; and a ``naiad serve``
that cannot start exits instead of hanging."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from naiad_harness import ROOT, free_port, run_server

MODELS = Path(__file__).parent / "models"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    shutil.copytree(MODELS / "nonfinite", root / "models" / "nonfinite")
    with run_server(root / "models", root / "serve", extra_args=["--model-control-mode", "explicit",
                                                               "--load-model", "nonfinite"]) as running:
        yield running


def strict_json(body: bytes):
    """RFC 8259 JSON only: NaN/Infinity tokens are refused."""
    def refuse(token: str):
        raise ValueError(f"not JSON: {token}")

    return json.loads(body, parse_constant=refuse)


@pytest.mark.parametrize("path", ["/v2/repository/models/nonfinite/load", "/v2/repository/index",
                                  "/v2/models/nonfinite/infer"])
def test_deeply_nested_json_is_a_400(server, path):
    body = b"[" * 100_000 + b"]" * 100_000
    response = requests.post(server.http + path, data=body, timeout=30)
    assert response.status_code == 400, response.text
    assert "error" in response.json()
    assert requests.get(f"{server.http}/v2/health/ready", timeout=5).status_code == 200


def test_non_finite_outputs_are_valid_json(server):
    body = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [2.5]}]}
    response = requests.post(f"{server.http}/v2/models/nonfinite/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    data = strict_json(response.content)["outputs"][0]["data"]
    assert data == ["NaN", "Infinity", "-Infinity", 2.5]
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        x = httpclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([2.5], np.float32))
        out = httpclient.InferRequestedOutput("Y", binary_data=False)
        y = client.infer("nonfinite", [x], outputs=[out]).as_numpy("Y")
    finally:
        client.close()
    np.testing.assert_array_equal(y, np.array([np.nan, np.inf, -np.inf, 2.5], np.float32))


def test_header_floods_answer_json_and_log_one_line(server):
    floods = [
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 20_000 + b"\r\n\r\n",
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-%d: 1\r\n" % i for i in range(50_000)) + b"\r\n",
    ]
    for _ in range(5):
        for flood in floods:
            with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
                sock.sendall(flood)
                head, _, body = sock.recv(65536).partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.0 400") or head.startswith(b"HTTP/1.1 400"), head
            assert b"application/json" in head and "error" in json.loads(body)
    log = server.log()
    assert "Traceback" not in log and log.count("refused a malformed request") >= 10
    assert requests.get(f"{server.http}/v2/health/ready", timeout=5).status_code == 200


def test_a_header_flood_still_sending_after_the_answer_reads_it(server):
    """The 400 comes while the client is still sending its flood (a small send buffer keeps
    most of it unsent); the gateway reads and drops the rest before it closes, so the client
    gets the answer, not a reset (it used to: BrokenPipeError on the client's send)."""
    flood = (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n"
             + b"".join(b"X-%d: 1\r\n" % i for i in range(50_000)) + b"\r\n")  # fmt: skip
    for _ in range(3):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
            sock.settimeout(10)
            sock.connect(("127.0.0.1", server.http_port))
            sock.sendall(flood)
            answer = b""
            while b"}" not in answer and (chunk := sock.recv(65536)):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split(b" ", 2)[1] == b"400", head  # aiohttp answers a bad head in HTTP/1.0
        assert "error" in json.loads(body)
    assert requests.get(f"{server.http}/v2/health/ready", timeout=5).status_code == 200


def test_serve_with_a_missing_repository_exits(tmp_path):
    args = [sys.executable, "-m", "naiad_cli", "serve", "--model-repository", str(tmp_path / "none"),
            "--http-port", str(free_port()), "--grpc-port", str(free_port()),
            "--metrics-port", str(free_port()), "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    # It used to hang ~45 s (the scaler's BLPOP swallowed its cancellation), then be killed.
    process = subprocess.run(args, cwd=ROOT, capture_output=True, timeout=30)
    assert process.returncode != 0, process.stdout[-2000:]
