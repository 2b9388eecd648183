"""A plain inference request's own HTTP/1.1 path, in front of aiohttp.

aiohttp's request machinery (a task, a request and a response object per request, the
router, the middlewares) costs ~107 µs of CPU a request at c32 on the benchmark's 2-core VM,
where a bare asyncio protocol costs ~34 (``bench/perf/http_front.py``,
``bench/results/http_front.md``): a fifth of the gateway's whole cost, and the gateway is the
bottleneck. :class:`FastFront` is therefore the first protocol of every connection of the
HTTP port. It answers a request itself only when all of this holds:

- the request's head and its whole body are in what has arrived (a small request comes in
  one segment; a body of at most :data:`MAX_WAITED_BODY_BYTES` sent after its head, as
  Python's ``http.client`` does, is waited for :data:`BODY_WAIT_S`);
- ``POST /v2/models/<name>[/versions/<n>]/infer HTTP/1.1``, no query, a name of ASCII
  letters, digits, ``_``, ``.`` and ``-`` (nothing percent-encoded);
- a well-formed head (RFC 9110 §5.1 token names, visible-ASCII values, no obs-fold) of at
  most :data:`MAX_HEAD_BYTES` and :data:`MAX_HEADERS` lines, with one ``Host``, one
  ``Content-Length`` no larger than the body limit, none of :data:`SINGLETON_FIELDS` twice,
  and no ``Transfer-Encoding``, ``Content-Encoding``, ``Expect`` or ``Upgrade``.

Any other request hands the connection, with every byte received so far, to aiohttp's handler
(:class:`gateway.http_limits.LimitedAppRunner`'s) for the rest of its life, so it is
answered exactly as before. A request taken here runs the aiohttp route's own code
(:func:`gateway.http.answer_infer`), with its error answers (:func:`gateway.http.error_answer`),
access check (``--http-restricted-api``) and limits: the gateway's in-flight bound
(:meth:`gateway.dataplane.DataPlane.admit`), the shared byte budget (its body), the connection
cap and header timer (the runner's server counts these connections as its own; a head handed
over keeps its deadline), the keep-alive
timeout while idle. A client that disconnects cancels its request (withdrawn from its queue,
as aiohttp's ``handler_cancellation``); a shutdown lets it finish within the grace period.
Requests pipelined on one connection are answered in order, one at a time, and none is
taken while the answers already written wait unread (the transport's write buffer is full).
"""

from __future__ import annotations

import asyncio
import logging
import re
import string
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

from aiohttp.http import SERVER_SOFTWARE
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.access import INFERENCE, AccessPolicy
from gateway.dataplane import DataPlane
from gateway.http import answer_infer, error_answer, error_json
from gateway.http_limits import HttpLimits
from gateway.limits import Reservation
from naiad.errors import Overloaded
from naiad.memo import remember

logger = logging.getLogger(__name__)

#: The request lines taken here: the model name, then an optional version (decimal digits).
REQUEST_LINE = re.compile(r"POST /v2/models/([A-Za-z0-9_.\-]+)(?:/versions/([0-9]{1,18}))?/infer HTTP/1\.1")
#: RFC 9110 §5.1: a field name is a token (§5.6.2); ``str.translate`` deletes these.
TOKEN_CHARS = dict.fromkeys(map(ord, "!#$%&'*+-.^_`|~" + string.digits + string.ascii_letters))
#: The bytes a head taken here may hold: visible ASCII, SP and HT (RFC 9110 §5.5 field
#: values without obs-text), and CR LF between lines.
HEAD_BYTES = bytes(range(0x20, 0x7F)) + b"\t\r\n"
#: Longest request head taken here (bytes, request line to the last header line); aiohttp's
#: own limit is 8190 bytes a line.
MAX_HEAD_BYTES = 8190
#: Most header lines taken here.
MAX_HEADERS = 64
#: Fields whose presence sends the request to aiohttp (framing, codings, interim answers).
HANDED_OVER_FIELDS = ("Transfer-Encoding", "Content-Encoding", "Expect", "Upgrade")
#: A body at most this large whose head came without it is waited for here (Python's
#: ``http.client``, under ``requests``, writes the head and the body apart); a larger one goes
#: to aiohttp at once.
MAX_WAITED_BODY_BYTES = 64 * 1024
#: Seconds such a body has to arrive whole (its bytes held against the byte budget meanwhile;
#: at most the first-byte timeout) before the connection goes to aiohttp, whose body timeouts
#: then apply from the hand-over.
BODY_WAIT_S = 0.25
#: Fields aiohttp's parser refuses (400) when sent twice (its ``SINGLETON_HEADERS``, RFC
#: 9110); a head with one of them twice, or without ``Host`` (RFC 9112 §3.2), is handed over
#: so that it is answered as aiohttp answers it.
SINGLETON_FIELDS = frozenset(
    ("content-length", "content-location", "content-range", "content-type", "etag", "host", "max-forwards",
     "server", "transfer-encoding", "user-agent")
)
#: Bytes a connection may hold pipelined behind the request it is answering before it stops
#: reading (TCP then pushes back on the client).
MAX_PIPELINED_BYTES = 256 * 1024
#: Reason phrases by status code (RFC 9110 §15); another code is written without one.
PHRASES = {status.value: status.phrase for status in HTTPStatus}
SERVER_SOFTWARE_BYTES = SERVER_SOFTWARE.encode("latin-1")
#: The error body's content type, as ``aiohttp.web.json_response`` writes it.
JSON_TYPE = "application/json; charset=utf-8"


@dataclass(frozen=True)
class Head:
    """A request head taken here: the target's model and version ("" when none), the
    fields (case-insensitive), the head's length in bytes with its blank line, the body's
    length, and whether the client asked to close after the answer."""

    model: str
    version: str
    headers: CIMultiDictProxy[str]  # read-only: one Head serves every request with its bytes
    length: int
    body_length: int
    close: bool


def parse_head(buffer: bytes | bytearray, max_body_bytes: int) -> Head | None:
    """The head at the start of ``buffer`` when this path takes it (module doc), else None:
    incomplete, another request, or anything this parser does not accept."""
    end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
    if end < 0:
        return None
    key = (bytes(buffer[:end]), max_body_bytes)
    head = _heads.get(key)
    if head is None and (head := _parse(*key)) is not None:
        remember(_heads, key, head, MAX_REMEMBERED_HEADS)
    return head


#: Heads taken, by their bytes and the body limit: a keep-alive client sends the same head
#: request after request (a body of another length is another head), so parsing one (~5 µs)
#: becomes a lookup (~0.3 µs). The Head is read-only.
_heads: dict[tuple[bytes, int], Head] = {}
MAX_REMEMBERED_HEADS = 1024


def _parse(raw: bytes, max_body_bytes: int) -> Head | None:
    """:func:`parse_head` of the head's bytes ``raw``, without its blank line."""
    if raw.translate(None, HEAD_BYTES) or not raw.count(b"\n") == raw.count(b"\r\n") == raw.count(b"\r"):
        return None  # a byte outside visible ASCII, SP, HT; or a CR or LF alone
    lines = raw.decode("ascii").split("\r\n")
    target = REQUEST_LINE.fullmatch(lines[0])
    if target is None or len(lines) > MAX_HEADERS + 1:
        return None
    pairs = []
    singletons = set()
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name.translate(TOKEN_CHARS):  # a name that is not a token
            return None
        lower = name.lower()
        if lower in SINGLETON_FIELDS:
            if lower in singletons:
                return None  # sent twice: aiohttp's 400
            singletons.add(lower)
        pairs.append((name, value.strip(" \t")))
    if "host" not in singletons:
        return None  # aiohttp's 400
    headers = CIMultiDictProxy(CIMultiDict(pairs))
    lengths = headers.getall("Content-Length", [])
    if len(lengths) != 1 or not lengths[0].isdigit() or len(lengths[0]) > 18:
        return None
    if int(lengths[0]) > max_body_bytes or any(name in headers for name in HANDED_OVER_FIELDS):
        return None
    # RFC 9110 §5.3: several Connection lines are one comma-separated list.
    tokens = {token.strip().lower() for token in ",".join(headers.getall("Connection", ())).split(",")}
    model, version = target.group(1), target.group(2) or ""
    return Head(model, version, headers, len(raw) + 4, int(lengths[0]), "close" in tokens)


_date: tuple[int, bytes] = (0, b"")


def http_date() -> bytes:
    """RFC 9110 §6.6.1 ``Date`` value of now (IMF-fixdate), formatted once a second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, formatdate(now, usegmt=True).encode("ascii"))
    return _date[1]


def answer_head(status: int, headers: dict[str, str], length: int, close: bool) -> bytes:
    """One HTTP/1.1 answer's head: status line, ``headers``, ``Content-Length: length``,
    ``Date``, ``Server`` (aiohttp's), ``Connection: close`` when ``close``, blank line."""
    lines = [f"HTTP/1.1 {status} {PHRASES.get(status, '')}"]
    for name, value in headers.items():
        lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {length}")
    head = "\r\n".join(lines).encode("latin-1") + b"\r\nDate: " + http_date() + b"\r\nServer: "
    return head + SERVER_SOFTWARE_BYTES + (b"\r\nConnection: close" if close else b"") + b"\r\n\r\n"


async def _given(body: bytes) -> bytes:
    return body


class FastFront(asyncio.Protocol):
    """One HTTP connection's first protocol (module doc). ``server`` is the runner's
    :class:`aiohttp.web.Server` (it counts this connection, arms its header timer and shuts
    it down); its ``handler()`` builds aiohttp's handler that takes the connection over."""

    _task_handler = None  # read by aiohttp's Server.connection_lost: no aiohttp task here

    def __init__(self, server: Any, dataplane: DataPlane, limits: HttpLimits, access: AccessPolicy | None):
        self._server, self._make_handler = server, server.handler
        self._dataplane, self._limits, self._access = dataplane, limits, access
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None  # the keep-alive timer (_keepalive)
        self._idle_since: float | None = None  # loop time it last went idle; None: busy
        self._body_timer: asyncio.TimerHandle | None = None  # waiting for a body's rest
        self._reservation: Reservation | None = None  # that body's bytes, meanwhile
        self._closing = False  # the server is shutting down: no new request
        self._paused = False  # reading paused: too many bytes pipelined, or answers unread
        self._writing_paused = False  # the transport's write buffer is full: no next request

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._server.connection_made(self, transport)  # the connection cap, the header timer

    def data_received(self, data: bytes) -> None:
        self._idle_since = None  # the keep-alive timer, when armed, finds the connection busy
        idle = not self._buffer and self._task is None and not self._writing_paused
        if idle and self.transport is not None and data.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4) < 0:
            self._server.arm_header_timer(self, self.transport)  # a request's head begins, not whole
        self._buffer += data
        if self._task is None and not self._writing_paused:
            self._take()
        elif len(self._buffer) > MAX_PIPELINED_BYTES and self.transport is not None:
            self.transport.pause_reading()
            self._paused = True

    def pause_writing(self) -> None:
        """The transport's write buffer is over its high-water mark (a client that does not
        read its answers): no next request is taken until it drains, and reading stops once
        :data:`MAX_PIPELINED_BYTES` wait (aiohttp's handler awaits ``drain`` likewise)."""
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._task is None:
            self._resume_reading()
            self._take()

    def _resume_reading(self) -> None:
        if self._paused and self.transport is not None:
            self.transport.resume_reading()
            self._paused = False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._task is not None:
            self._task.cancel()  # the client went away: its request is withdrawn
        if self._idle is not None:
            self._idle.cancel()
        self._stop_waiting()
        self.transport = None
        self._server.connection_lost(self, exc)

    def _take(self) -> None:
        """Answer the request at the buffer's start here, or hand the connection over."""
        if self.transport is None or self.transport.is_closing():
            return
        if self._closing:
            self.transport.close()
            return
        if not self._buffer:
            self._idle_since = self._loop.time()
            if self._idle is None:
                self._idle = self._loop.call_later(self._limits.keepalive_timeout_s, self._keepalive)
            return
        head = parse_head(self._buffer, self._limits.max_body_bytes)
        if head is None:
            self._hand_over()
            return
        end = head.length + head.body_length
        if len(self._buffer) < end:
            self._wait_for_body(head)
            return
        reservation = self._reservation or self._limits.budget.reservation()
        self._reservation = None
        self._stop_waiting()
        self._server.headers_received(self)
        body = bytes(self._buffer[head.length : end])
        del self._buffer[:end]
        self._task = self._loop.create_task(self._answer(head, body, reservation))
        self._task.add_done_callback(self._answered)

    def _keepalive(self) -> None:
        """The keep-alive timer: close a connection idle for the keep-alive timeout; else
        wait again, until that long after it last went idle (when it is idle now; a busy one
        arms it anew when it next goes idle). One timer a connection, not one a request."""
        self._idle = None
        if self._idle_since is None or self.transport is None:
            return
        left = self._idle_since + self._limits.keepalive_timeout_s - self._loop.time()
        if left <= 0:
            self.transport.close()
        else:
            self._idle = self._loop.call_later(left, self._keepalive)

    def _wait_for_body(self, head: Head) -> None:
        """The head is here, its body not whole: wait :data:`BODY_WAIT_S` for a small one,
        holding its bytes against the budget; a large one, or a full budget, goes to aiohttp."""
        if self._body_timer is not None:
            return  # waiting already
        if head.body_length > MAX_WAITED_BODY_BYTES:
            self._hand_over()
            return
        reservation = self._limits.budget.reservation()
        try:
            reservation.add(head.body_length)
        except Overloaded:  # aiohttp answers it (503) with its own reservation
            self._hand_over()
            return
        self._reservation = reservation
        self._server.headers_received(self)  # the head is whole: no header timer while waiting
        wait_s = min(BODY_WAIT_S, self._limits.body_first_byte_timeout_s)
        self._body_timer = self._loop.call_later(wait_s, self._hand_over)

    def _stop_waiting(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if self._reservation is not None:
            self._reservation.release()
            self._reservation = None

    async def _answer(self, head: Head, body: bytes, reservation: Reservation) -> None:
        dataplane = self._dataplane
        try:
            if self._access:
                self._access.check(INFERENCE, head.headers)
            with dataplane.admit(), reservation:
                reservation.resize(len(body))  # held already when its body was waited for
                payload, headers = await answer_infer(dataplane, head.model, head.version, head.headers,
                                                      lambda: _given(body))  # fmt: skip
            status, close = 200, head.close
        except Exception as exc:
            path = f"/v2/models/{head.model}{f'/versions/{head.version}' if head.version else ''}/infer"
            status, message, extra, close = error_answer(exc, "POST", path)
            payload = error_json(message).encode()
            headers, close = {"Content-Type": JSON_TYPE, **extra}, close or head.close
        transport, close = self.transport, close or self._closing
        if transport is not None and not transport.is_closing():
            transport.writelines((answer_head(status, headers, len(payload), close), payload))
            if close:
                transport.close()

    def _answered(self, task: asyncio.Task[None]) -> None:
        self._task = None
        if self._writing_paused:
            return  # resume_writing takes the next request
        self._resume_reading()
        self._take()

    def _hand_over(self) -> None:
        """aiohttp's handler takes the connection, with the bytes received so far."""
        self._stop_waiting()
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        transport, data = self.transport, bytes(self._buffer)
        self._buffer.clear()
        deadline = self._server.header_deadline(self)  # the head being read keeps its deadline
        self._server.connection_lost(self, None)  # forgotten here, counted again as the handler
        self.transport = None
        if transport is None or transport.is_closing():
            return
        logger.debug("a connection from %s goes to aiohttp", transport.get_extra_info("peername"))
        handler = self._make_handler()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if deadline is not None:
            self._server.arm_header_timer(handler, transport, at=deadline)
        if self._paused:
            transport.resume_reading()
        if data:
            handler.data_received(data)

    def close(self) -> None:
        """The server stops (aiohttp's ``pre_shutdown``): an idle connection closes now, a
        busy one after its answer."""
        self._closing = True
        if self._task is None and self.transport is not None:
            self.transport.close()

    async def shutdown(self, timeout: float | None = None) -> None:
        """aiohttp's ``Server.shutdown``: the request in flight gets ``timeout`` seconds to be
        answered, then is cancelled; the connection closes."""
        self._closing = True
        task = self._task
        if task is not None:
            await asyncio.wait([task], timeout=timeout)
            if not task.done():
                task.cancel()
                await asyncio.wait([task], timeout=1.0)
        if self.transport is not None:
            self.transport.close()


def fast_front(
    dataplane: DataPlane, limits: HttpLimits, access: AccessPolicy | None = None
) -> Callable[[Any], FastFront]:
    """The ``front`` of :class:`gateway.http_limits.LimitedAppRunner`: a :class:`FastFront`
    per connection, answering with ``dataplane`` under ``limits`` and ``access``."""
    return lambda server: FastFront(server, dataplane, limits, access)
