"""Issue 17, findings 1 and 3: what one client can make the gateway hold before any work.

Each test plays the hostile client on loopback against a real ``naiad serve`` (digits), with
bounded loops, then checks that a good client is still served.
"""

from __future__ import annotations

import concurrent.futures
import json
import time

import numpy as np
import psutil
import pytest
import requests
import tritonclient.grpc as grpcclient
from naiad_harness import run_server

from tests.hardening.raw_clients import closed_within, declare_huge_grpc_message, http_connect

MiB = 2**20
TOKEN = "Bearer hardening-test"


@pytest.fixture(scope="module")
def default_server(example_repository, tmp_path_factory):
    """Default limits; gRPC ``inference`` restricted to a bearer token."""
    with run_server(
        example_repository, tmp_path_factory.mktemp("limits-default"),
        extra_env={"NAIAD_GRPC_RESTRICTED_PROTOCOL": json.dumps([f"inference:authorization={TOKEN}"])},
    ) as server:  # fmt: skip
        yield server


@pytest.fixture(scope="module")
def tight_server(example_repository, tmp_path_factory):
    """Small limits, so that each one is reached in a second or two."""
    args = ["--http-header-timeout", "1", "--http-body-first-byte-timeout", "1",
            "--http-body-timeout", "3", "--http-max-connections", "16", "--max-inflight", "4",
            "--grpc-max-message-size", str(MiB), "--max-buffered-bytes", str(3 * MiB)]  # fmt: skip
    with run_server(
        example_repository, tmp_path_factory.mktemp("limits-tight"), extra_args=args,
        extra_env={"NAIAD_HTTP_MAX_BODY_BYTES": str(MiB)},
    ) as server:  # fmt: skip
        yield server


def rss_mib(server) -> float:
    return psutil.Process(server.process.pid).memory_info().rss / MiB


def good_infer(server) -> None:
    """One digits request over HTTP that must succeed."""
    x = np.zeros((1, 64), np.float32)
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x.ravel().tolist()}]}
    response = requests.post(f"{server.http}/v2/models/digits/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text


def test_grpc_message_declared_at_2gib_is_refused_before_it_is_buffered(default_server):
    good_infer(default_server)
    before = rss_mib(default_server)
    token = (("authorization", TOKEN),)
    outcomes = [declare_huge_grpc_message(default_server.grpc_port, metadata=token) for _ in range(2)]
    for outcome in outcomes:
        assert outcome.ended_by_server, outcome
        assert outcome.sent_bytes < 80 * MiB, outcome  # cut near the 64 MiB limit, not at 256
    assert rss_mib(default_server) - before < 150, (before, rss_mib(default_server))
    good_infer(default_server)


def test_grpc_refused_credentials_read_no_message(default_server):
    before = rss_mib(default_server)
    outcomes = [declare_huge_grpc_message(default_server.grpc_port, declared=60 * MiB) for _ in range(2)]
    for outcome in outcomes:
        assert outcome.ended_by_server and outcome.grpc_status == "16", outcome  # UNAUTHENTICATED
        assert outcome.sent_bytes < 8 * MiB, outcome
    assert rss_mib(default_server) - before < 100


def test_grpc_max_message_size_flag(tight_server):
    client = grpcclient.InferenceServerClient(tight_server.grpc_url)
    try:
        x = np.zeros((5000, 64), np.float32)  # 1.2 MiB, over --grpc-max-message-size 1 MiB
        tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        with pytest.raises(Exception, match="RESOURCE_EXHAUSTED|larger than max"):
            client.infer("digits", [tensor])
        small = grpcclient.InferInput("input", [1, 64], "FP32")
        small.set_data_from_numpy(x[:1])
        assert client.infer("digits", [small]).as_numpy("label").shape[0] == 1
    finally:
        client.close()


def test_silent_and_half_header_connections_are_closed(tight_server):
    silent = http_connect(tight_server.http_port)
    half = http_connect(tight_server.http_port)
    half.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
    for sock in (silent, half):
        closed, _ = closed_within(sock, 10)
        assert closed
        sock.close()
    good_infer(tight_server)


def test_declared_body_over_the_limit_is_refused_before_reading(tight_server):
    sock = http_connect(tight_server.http_port)
    sock.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000000000\r\n\r\n{")
    closed, got = closed_within(sock, 15)
    sock.close()
    assert got.startswith(b"HTTP/1.1 413"), got[:200]
    assert closed


def slow_upload(port: int, declared: int, seconds: float) -> bytes:
    """A body of ``declared`` bytes sent one byte each 0.2 s for ``seconds`` (then given up)."""
    sock = http_connect(port)
    try:
        sock.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % declared)
        deadline = time.monotonic() + seconds
        sock.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                sock.sendall(b" ")
                got = sock.recv(65536)
                if got or got == b"":
                    return got
            except TimeoutError:
                continue
            except OSError:
                return b""
        return b"(no answer)"
    finally:
        sock.close()


def test_slow_uploads_time_out_and_free_their_slots(tight_server):
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # --max-inflight 4: all of them
        answers = list(pool.map(lambda _: slow_upload(tight_server.http_port, 100_000, 20), range(4)))
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    good_infer(tight_server)


def test_body_that_never_starts_times_out(tight_server):
    sock = http_connect(tight_server.http_port)
    sock.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
    started = time.monotonic()
    closed, got = closed_within(sock, 10)
    sock.close()
    assert got.startswith(b"HTTP/1.1 408") and closed, got[:200]
    assert time.monotonic() - started < 3 + 1  # the first-byte timeout (1 s), not the body's (3 s)


def test_connection_cap_answers_503_and_recovers(tight_server):
    idle = [http_connect(tight_server.http_port) for _ in range(16)]
    try:
        extra = http_connect(tight_server.http_port)
        closed, got = closed_within(extra, 10)
        extra.close()
        assert got.startswith(b"HTTP/1.1 503") and b'"error"' in got and closed, got[:200]
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 10
    while True:  # the server sees the closes a moment later
        try:
            good_infer(tight_server)
            break
        except (AssertionError, requests.ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_buffered_bytes_are_bounded_across_requests(tight_server):
    """Four uploads of 0.9 MiB each, held open: the budget (3 MiB) takes three."""
    socks = []
    try:
        for _ in range(4):
            sock = http_connect(tight_server.http_port)
            sock.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % MiB)
            sock.sendall(b" " * (9 * MiB // 10))
            socks.append(sock)
            time.sleep(0.3)
        closed, got = closed_within(socks[-1], 5)
        assert got.startswith(b"HTTP/1.1 503") and b"max-buffered-bytes" in got, got[:300]
    finally:
        for sock in socks:
            sock.close()
    good_infer(tight_server)


def test_gateway_fds_stay_bounded(tight_server):
    """Hundreds of connections opened and dropped leave no descriptor behind."""
    proc = psutil.Process(tight_server.process.pid)
    before = proc.num_fds()
    for _ in range(10):
        socks = [http_connect(tight_server.http_port) for _ in range(30)]
        for sock in socks:
            sock.close()
    deadline = time.monotonic() + 10
    while proc.num_fds() > before + 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.num_fds() <= before + 5


def test_keep_alive_connections_outlive_the_header_timeout(tight_server):
    """The header timer stops once a request's head is parsed: a keep-alive connection used
    again after longer than ``--http-header-timeout`` (1 s) is still served."""
    for port in (tight_server.http_port, tight_server.metrics_port):
        path = b"/v2/health/live" if port == tight_server.http_port else b"/metrics"
        sock = http_connect(port)
        try:
            for _ in range(2):
                sock.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
                sock.settimeout(10)
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
                time.sleep(1.5)
        finally:
            sock.close()


def test_chunked_body_over_the_limit_is_refused_once_over(tight_server):
    """No Content-Length to refuse from: the read stops once the body passes the limit."""
    chunk = b" " * (256 * 1024)
    sock = http_connect(tight_server.http_port)
    try:
        sock.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        sock.settimeout(0.05)
        got = b""
        for _ in range(40):  # up to 10 MiB, far past the 1 MiB limit
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                got = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if got:
                break
    finally:
        sock.close()
    assert got.startswith(b"HTTP/1.1 413"), got[:200]
    good_infer(tight_server)


def test_grpc_silent_connection_and_stalled_message_are_ended(tight_server):
    """gRPC's own slow clients: a TCP connection that never sends the HTTP/2 preface is closed
    after the handshake timeout (``--http-header-timeout``); a call whose message stalls is
    ended DEADLINE_EXCEEDED after ``--http-body-timeout`` (3 s), freeing its slot."""
    silent = http_connect(tight_server.grpc_port)
    closed, _ = closed_within(silent, 15)
    silent.close()
    assert closed
    stalled = declare_huge_grpc_message(tight_server.grpc_port, declared=1000, send_limit=10, timeout_s=15)
    assert stalled.ended_by_server and stalled.grpc_status == "4", stalled  # DEADLINE_EXCEEDED
    good_infer(tight_server)


def test_a_later_request_head_sent_slowly_is_cut_by_the_header_timeout(tight_server):
    """On a keep-alive connection, the second request's head dribbled byte by byte is cut
    ``--http-header-timeout`` (1 s) after its first byte, not after the keep-alive timeout."""
    sock = http_connect(tight_server.http_port)
    try:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.settimeout(0.3)
        closed = False
        for byte in b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:  # 30 s at most
            try:
                sock.sendall(bytes([byte]))
                if sock.recv(65536) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
        assert closed
    finally:
        sock.close()
