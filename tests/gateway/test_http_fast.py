"""The plain inference request's own HTTP/1.1 path (``gateway/http_fast.py``).

Which heads it takes (the rest go to aiohttp), and on a real ``naiad serve`` with the example
``digits`` model: the same request answered by this path (head and body in one segment) and
by aiohttp (head and body sent apart, so the connection is handed over) gets the same status,
body and headers; pipelined requests, taken and handed over, are answered in order; an idle
connection closes after the keep-alive timeout; ``Connection: close`` is honoured; the
hand-over shows at DEBUG."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import numpy as np
import pytest
import requests
from naiad_harness import run_server

from gateway.http_fast import BODY_WAIT_S, MAX_HEADERS, parse_head

DATA = b",".join([b"0.5"] * 64)
BODY = b'{"inputs":[{"name":"input","shape":[1,64],"datatype":"FP32","data":[' + DATA + b"]}]}"


def head(target: bytes = b"/v2/models/digits/infer", extra: bytes = b"", method: bytes = b"POST",
         version: bytes = b"HTTP/1.1", length: int = len(BODY)) -> bytes:  # fmt: skip
    return (method + b" " + target + b" " + version + b"\r\nHost: x\r\nContent-Type: application/json\r\n"
            + extra + b"Content-Length: %d\r\n\r\n" % length)  # fmt: skip


def test_a_plain_inference_head_is_taken_with_its_model_version_and_fields() -> None:
    raw = head(b"/v2/models/my_model-2.b/versions/3/infer", b"X-Naiad-Route: k\r\n")
    taken = parse_head(raw + BODY, 2**20)
    assert taken is not None
    assert (taken.model, taken.version, taken.body_length) == ("my_model-2.b", "3", len(BODY))
    assert taken.headers["x-naiad-route"] == "k" and taken.length == len(raw) and not taken.close
    assert parse_head(head(extra=b"Connection: keep-alive, Close\r\n"), 2**20).close
    assert parse_head(head(extra=b"Connection: keep-alive\r\nConnection: close\r\n"), 2**20).close


def test_a_head_sent_again_is_the_same_head_and_its_fields_are_read_only() -> None:
    """Heads are remembered by their bytes and the body limit: the same bytes give the same
    (read-only) head, other bytes or another limit are parsed on their own."""
    first = parse_head(head() + BODY, 2**20)
    assert parse_head(bytearray(head() + b"next request"), 2**20) is first
    with pytest.raises(TypeError):
        first.headers["Host"] = "elsewhere"  # type: ignore[index]
    longer = parse_head(head(length=len(BODY) + 1), 2**20)
    assert longer is not first and longer.body_length == len(BODY) + 1
    assert parse_head(head(length=len(BODY) + 1), len(BODY)) is None  # over this limit


@pytest.mark.parametrize(
    "raw",
    [
        head(method=b"GET"),
        head(version=b"HTTP/1.0"),
        head(b"/v2/models/digits/infer?x=1"),
        head(b"/v2/models/dig%69ts/infer"),
        head(b"/v2/models/digits/versions/x/infer"),
        head(b"/v2/models/digits"),
        head(b"//v2/models/digits/infer"),
        head(extra=b"Transfer-Encoding: chunked\r\n"),
        head(extra=b"Content-Encoding: gzip\r\n"),
        head(extra=b"Expect: 100-continue\r\n"),
        head(extra=b"Upgrade: h2c\r\n"),
        head(extra=b"Content-Length: 5\r\n"),  # two lengths
        head(extra=b"X-Folded: a\r\n b\r\n"),  # obs-fold
        head(extra=b"Bad Name: x\r\n"),
        head(extra=b"X-Bad: caf\xc3\xa9\r\n"),
        head(extra=b"X-Bad: a\x01b\r\n"),
        head(extra=b"X-Bare-LF: a\nContent-Length: 1\r\n"),
        head(extra=b"X-Bare-CR: a\rb\r\n"),
        head(extra=b"Content-Length : 5\r\n"),
        head(extra=b"NoColon\r\n"),
        head(extra=b"X: y\r\n" * MAX_HEADERS),
        head(length=2**20 + 1),
        b"POST /v2/models/digits/infer HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
        b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\n\r\n",  # no Content-Length
        head()[:-2],  # the head has not ended
        head().replace(b"Host: x\r\n", b""),  # no Host: aiohttp's 400 (RFC 9112 3.2)
        head(extra=b"Host: y\r\n"),  # two Hosts: aiohttp's 400
        head(extra=b"Content-Type: text/plain\r\n"),  # a singleton field twice: aiohttp's 400
        head(extra=b"User-Agent: a\r\nuser-agent: b\r\n"),
    ],
)
def test_any_other_head_is_left_to_aiohttp(raw: bytes) -> None:
    assert parse_head(raw + BODY, 2**20) is None


def exchange(port: int, *parts: bytes, pause_s: float = 0.0, answers: int = 1, timeout_s: float = 30) -> list:
    """Send ``parts`` on one connection (``pause_s`` between them) and read ``answers``
    answers: ``(status, headers {lower name: value}, body)`` each."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        for index, part in enumerate(parts):
            if index and pause_s:
                time.sleep(pause_s)
            sock.sendall(part)
        return read_answers(sock, answers)


def read_answers(sock: socket.socket, count: int) -> list:
    data, found = b"", []
    while len(found) < count:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            lines = data[:end].decode("latin-1").split("\r\n")
            pairs = (line.partition(":") for line in lines[1:])
            fields = {name.lower(): value.strip() for name, _, value in pairs}
            size = int(fields["content-length"])
            if len(data) >= end + 4 + size:
                found.append((int(lines[0].split()[1]), fields, data[end + 4 : end + 4 + size]))
                data = data[end + 4 + size :]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {len(found)} answers")
        data += chunk
    return found


CASES = {
    "json": (b"/v2/models/digits/infer", BODY, b""),
    "version": (b"/v2/models/digits/versions/1/infer", BODY, b""),
    "unknown model": (b"/v2/models/nope/infer", BODY, b""),
    "unknown version": (b"/v2/models/digits/versions/9/infer", BODY, b""),
    "bad json": (b"/v2/models/digits/infer", b"{nope", b""),
    "wrong shape": (b"/v2/models/digits/infer", BODY.replace(b"[1,64]", b"[1,63]"), b""),
    "gzip accepted": (b"/v2/models/digits/infer", BODY, b"Accept-Encoding: gzip\r\n"),
    "binary output": (
        b"/v2/models/digits/infer",
        BODY[:-1] + b',"outputs":[{"name":"label","parameters":{"binary_data":true}}]}',
        b"",
    ),
}
COMPARED = ("content-type", "content-length", "vary", "content-encoding", "inference-header-content-length")


@pytest.fixture(scope="module")
def server(example_repository, tmp_path_factory):
    work = tmp_path_factory.mktemp("fast")
    args = ["--log-verbose", "1", "--http-keepalive-timeout", "4", "--http-header-timeout", "3"]
    with run_server(example_repository, work, extra_args=args) as running:
        yield running


@pytest.fixture(scope="module")
def reference(example_repository, tmp_path_factory):
    """The same server with every request through aiohttp."""
    work = tmp_path_factory.mktemp("aiohttp")
    with run_server(example_repository, work, extra_args=["--http-fast-infer", "false"]) as running:
        yield running


@pytest.mark.parametrize("case", sorted(CASES))
def test_this_path_and_aiohttp_answer_a_request_alike(server, reference, case: str) -> None:
    target, body, extra = CASES[case]
    raw_head = head(target, extra, length=len(body))
    before = server.log().count("goes to aiohttp")
    [fast] = exchange(server.http_port, raw_head + body)
    [apart] = exchange(server.http_port, raw_head, body, pause_s=0.1)  # http.client's two writes
    assert server.log().count("goes to aiohttp") == before  # both taken here
    [slow] = exchange(reference.http_port, raw_head + body)
    for other in (apart, slow):
        assert fast[0] == other[0] and fast[2] == other[2], (fast, other)
        assert {k: fast[1].get(k) for k in COMPARED} == {k: other[1].get(k) for k in COMPARED}
    if fast[0] != 200:
        assert "error" in json.loads(fast[2])
    elif case == "json":
        outputs = {o["name"]: o for o in json.loads(fast[2])["outputs"]}
        assert np.isclose(sum(outputs["probabilities"]["data"]), 1.0, atol=1e-4)


def test_a_body_that_does_not_come_whole_in_time_goes_to_aiohttp(server) -> None:
    """Waited for at most BODY_WAIT_S; then aiohttp reads the rest under its own timeouts."""
    raw_head = head()
    before = server.log().count("goes to aiohttp")
    half = len(BODY) // 2
    parts = (raw_head + BODY[:half], BODY[half:])
    [(status, _, body)] = exchange(server.http_port, *parts, pause_s=BODY_WAIT_S + 0.5)
    assert server.log().count("goes to aiohttp") == before + 1
    assert status == 200 and json.loads(body)["model_name"] == "digits"


def test_pipelined_requests_are_answered_in_order_taken_or_handed_over(server) -> None:
    unknown = head(b"/v2/models/nope/infer") + BODY
    metadata = b"GET /v2/models/digits HTTP/1.1\r\nHost: x\r\n\r\n"
    answers = exchange(server.http_port, head() + BODY + unknown + metadata + head() + BODY, answers=4)
    assert [status for status, _, _ in answers] == [200, 404, 200, 200]
    assert json.loads(answers[2][2])["name"] == "digits"
    assert json.loads(answers[3][2])["model_name"] == "digits"


def test_connection_close_and_the_keepalive_timeout_end_the_connection(server) -> None:
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(head(extra=b"Connection: close\r\n") + BODY)
        [(status, fields, _)] = read_answers(sock, 1)
        assert status == 200 and fields["connection"] == "close"
        assert sock.recv(100) == b""  # closed by the server
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(head() + BODY)
        assert read_answers(sock, 1)[0][0] == 200
        started = time.monotonic()
        assert sock.recv(100) == b""  # idle past --http-keepalive-timeout 4
        assert 3.5 < time.monotonic() - started < 10


def test_the_keepalive_timeout_counts_from_the_last_answer(server) -> None:
    """Requests 3 s apart on one connection (keep-alive 4 s) keep it open past the first
    request's 4 s; idle after the last answer, it closes 4 s later (one timer a connection,
    moved along, not one a request)."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        for _ in range(3):
            sock.sendall(head() + BODY)
            assert read_answers(sock, 1)[0][0] == 200
            time.sleep(3)
        sock.sendall(head() + BODY)
        assert read_answers(sock, 1)[0][0] == 200  # 9 s after the first: still open
        started = time.monotonic()
        assert sock.recv(100) == b""
        assert 3.5 < time.monotonic() - started < 10


def successes(server) -> int:
    """The digits model's successful requests (statistics extension; flushed first)."""
    stats = requests.get(f"{server.http}/v2/models/digits/stats", timeout=30).json()
    return stats["model_stats"][0]["inference_stats"]["success"]["count"]


def test_a_client_that_never_reads_its_answers_stops_being_served(server) -> None:
    """No next request is taken while the answers written wait unread (pause_writing), and
    reading stops once MAX_PIPELINED_BYTES wait: the requests executed stop growing. Before,
    one such client had 62,040 requests executed in 25 s and the gateway grew past 1.4 GB. The
    answers are large so that the kernel's socket buffers (up to 4 MiB here) fill in seconds."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.http_port))
    rows = BODY.replace(b"[1,64]", b"[64,64]").replace(DATA, b",".join([DATA] * 64))  # ~13 KB answers
    flood = (head(length=len(rows)) + rows) * 20

    def send() -> None:
        with contextlib.suppress(OSError):  # closed by the test at the end
            while True:
                sock.sendall(flood)  # blocks once nothing more is read

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    counts = [successes(server)]
    while len(counts) < 60 and (len(counts) < 4 or counts[-1] != counts[-3]):
        time.sleep(0.5)
        counts.append(successes(server))
    sock.close()
    assert counts[-1] == counts[-3], counts  # stalled: nothing more taken
    assert exchange(server.http_port, head() + BODY)[0][0] == 200  # others are served


def test_a_head_handed_over_keeps_its_header_deadline(server) -> None:
    """--http-header-timeout 3 (keep-alive 4): a connection that sends half a head after
    2.5 s goes to aiohttp, which must close it 3 s from the start, not 3 s (or its keep-alive
    timeout) from the hand-over."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        started = time.monotonic()
        time.sleep(2.5)
        sock.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\n")  # incomplete
        assert sock.recv(100) == b""  # closed for want of a whole head
        assert 2.5 < time.monotonic() - started < 4.5


def test_the_path_can_be_turned_off(example_repository, tmp_path) -> None:
    args = ["--log-verbose", "1", "--http-fast-infer", "false"]
    with run_server(example_repository, tmp_path / "off", extra_args=args) as off:
        [(status, _, body)] = exchange(off.http_port, head() + BODY)
        assert status == 200 and json.loads(body)["model_name"] == "digits"
        assert "goes to aiohttp" not in off.log()  # aiohttp's handler from the start


def test_a_client_that_half_closes_after_its_request_is_no_error(reference) -> None:
    """On aiohttp's path a client that shuts its side right after sending gave an ERROR
    with a traceback each time (``ConnectionResetError`` while its body was read): a client
    could fill the log. Now the handler is cancelled quietly; the server keeps serving."""
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", reference.http_port), timeout=30) as sock:
            sock.sendall(head() + BODY)
            sock.shutdown(socket.SHUT_WR)
            with contextlib.suppress(OSError):
                sock.recv(100)
    assert exchange(reference.http_port, head() + BODY)[0][0] == 200
    assert "Traceback" not in reference.log() and "unhandled error" not in reference.log()
