"""Restricted API groups on a real ``naiad serve``, driven by ``tritonclient`` (http and grpc):
for each group the right key, a wrong key of the same length, one of another length, and none.
The groups come from the environment (``NAIAD_HTTP_RESTRICTED_API``,
``NAIAD_GRPC_RESTRICTED_PROTOCOL``; the flags are parsed in test_access.py); no key may show
in any log line, with every logger at DEBUG."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import psutil
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from naiad_harness import run_server
from tritonclient.utils import InferenceServerException

INFER_KEY = "Bearer infer-7f3a9c1e5b2d4f60"
ADMIN_KEY = "Bearer admin-0c4e8a2f6b1d3e57"
META_KEY = "meta-5d2b7e9a1c3f4068"
SECRETS = (INFER_KEY, ADMIN_KEY, META_KEY, "7f3a9c1e5b2d4f60", "0c4e8a2f6b1d3e57", "5d2b7e9a1c3f4068")

HTTP_GROUPS = [
    f"inference:Authorization={INFER_KEY}",
    f"model-repository,statistics,model-config,metrics:Authorization={ADMIN_KEY}",
    f"metadata:X-Naiad-Key={META_KEY}",
]
GRPC_GROUPS = [
    f"inference:authorization={INFER_KEY}",
    f"model-repository,statistics,model-config:authorization={ADMIN_KEY}",
    f"health,metadata:naiad-key={META_KEY}",
]


def wrong_same_length(key: str) -> str:
    return key[:-1] + ("0" if key[-1] != "0" else "1")


def variants(header: str, key: str) -> list[tuple[dict[str, str] | None, bool]]:
    """(headers, allowed): the right key, same-length wrong key, longer, shorter, none."""
    return [
        ({header: key}, True),
        ({header: wrong_same_length(key)}, False),
        ({header: key + "x"}, False),
        ({header: key[:8]}, False),
        (None, False),
    ]


@pytest.fixture(scope="module")
def server(example_repository, tmp_path_factory):
    env = {
        "NAIAD_HTTP_RESTRICTED_API": json.dumps(HTTP_GROUPS),
        "NAIAD_GRPC_RESTRICTED_PROTOCOL": json.dumps(GRPC_GROUPS),
    }
    with run_server(
        example_repository,
        tmp_path_factory.mktemp("access"),
        extra_env=env,
        extra_args=["--log-verbose", "2", "--metrics-address", "127.0.0.1"],
    ) as running:
        yield running
        log = running.log()
    for secret in SECRETS:
        assert secret not in log, f"a key shows in the server log: {secret[:12]}..."


def digits_http() -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 64), np.float32))
    return [tensor]


def digits_grpc() -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 64), np.float32))
    return [tensor]


def http_calls(client: httpclient.InferenceServerClient):
    return {
        "inference": ("Authorization", INFER_KEY, lambda h: client.infer("digits", digits_http(), headers=h)),
        "statistics": ("Authorization", ADMIN_KEY, lambda h: client.get_inference_statistics(headers=h)),
        "model-repository": (
            "Authorization", ADMIN_KEY, lambda h: client.get_model_repository_index(headers=h)
        ),
        "model-config": ("Authorization", ADMIN_KEY, lambda h: client.get_model_config("digits", headers=h)),
        "metadata": ("X-Naiad-Key", META_KEY, lambda h: client.get_model_metadata("digits", headers=h)),
    }


@pytest.mark.parametrize("group", ["inference", "statistics", "model-repository", "model-config", "metadata"])
def test_http_groups(server, group):
    client = httpclient.InferenceServerClient(server.url, network_timeout=120)
    try:
        header, key, call = http_calls(client)[group]
        for headers, allowed in variants(header, key):
            if allowed:
                call(headers)
                continue
            with pytest.raises(InferenceServerException) as caught:
                call(headers)
            assert caught.value.status() == "401", (group, caught.value)
            assert "credentials" in caught.value.message()
    finally:
        client.close()


def test_http_keys_do_not_open_other_groups(server):
    client = httpclient.InferenceServerClient(server.url)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.get_inference_statistics(headers={"Authorization": INFER_KEY})
        assert caught.value.status() == "401"
        assert client.is_server_live() and client.is_server_ready()  # health is open over HTTP
    finally:
        client.close()


def test_raw_http_401_is_json_with_www_authenticate(server):
    response = requests.post(f"{server.http}/v2/models/digits/infer", json={"inputs": []}, timeout=10)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert "error" in response.json()
    # The body is not read before the check: a refused request never reaches the parser.
    response = requests.post(f"{server.http}/v2/models/digits/infer", data=b"\0garbage", timeout=10)
    assert response.status_code == 401
    # Unknown routes stay 404 (no group), the status page is 'statistics'.
    assert requests.get(f"{server.http}/v2/nothing", timeout=10).status_code == 404
    assert requests.get(server.http + "/", timeout=10).status_code == 401
    page = requests.get(server.http + "/", headers={"Authorization": ADMIN_KEY}, timeout=10)
    assert page.status_code == 200 and "<html" in page.text.lower()


def test_metrics_port_is_restricted_and_local(server):
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    for headers, allowed in variants("Authorization", ADMIN_KEY):
        response = requests.get(url, headers=headers or {}, timeout=10)
        assert response.status_code == (200 if allowed else 401), response.text[:200]
        if not allowed:
            assert "error" in response.json()
    listening = {
        conn.laddr for conn in psutil.Process(server.process.pid).net_connections("tcp")
        if conn.status == psutil.CONN_LISTEN
    }
    assert ("127.0.0.1", server.metrics_port) in listening
    assert ("0.0.0.0", server.http_port) in listening


def test_keys_from_the_environment_are_not_in_the_process_listing(server):
    for proc in [psutil.Process(server.process.pid), *server.children()]:
        cmdline = " ".join(proc.cmdline())
        assert not any(secret in cmdline for secret in SECRETS)


def grpc_calls(client: grpcclient.InferenceServerClient):
    return {
        "inference": ("authorization", INFER_KEY, lambda h: client.infer("digits", digits_grpc(), headers=h)),
        "statistics": ("authorization", ADMIN_KEY, lambda h: client.get_inference_statistics(headers=h)),
        "model-repository": (
            "authorization", ADMIN_KEY, lambda h: client.get_model_repository_index(headers=h)
        ),
        "model-config": ("authorization", ADMIN_KEY, lambda h: client.get_model_config("digits", headers=h)),
        # Triton's own metadata form: triton-grpc-protocol-<key>.
        "metadata": (
            "triton-grpc-protocol-naiad-key", META_KEY, lambda h: client.get_server_metadata(headers=h)
        ),
        "health": ("naiad-key", META_KEY, lambda h: client.is_server_live(headers=h)),
    }


@pytest.mark.parametrize(
    "group", ["inference", "statistics", "model-repository", "model-config", "metadata", "health"]
)
def test_grpc_groups(server, group):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        header, key, call = grpc_calls(client)[group]
        for headers, allowed in variants(header, key):
            if allowed:
                call(headers)
                continue
            with pytest.raises(InferenceServerException) as caught:
                call(headers)
            assert caught.value.status() == "StatusCode.UNAUTHENTICATED", (group, caught.value)
    finally:
        client.close()


def test_grpc_stream_is_inference(server):
    import queue

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put(error), headers={"authorization": "x"})
        # The stream is refused when it opens; a request sent after that may find it closed.
        with contextlib.suppress(InferenceServerException):
            client.async_stream_infer("digits", digits_grpc())
        error = results.get(timeout=30)
        assert error is not None and "UNAUTHENTICATED" in str(error.status())
    finally:
        client.stop_stream()
        client.close()
