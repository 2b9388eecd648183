"""HTTP/2 server connections (RFC 9113), framed by hand, for the gateway's gRPC front.

Why not grpc.aio: in `bench/perf/grpc_front.py` a ``ModelInfer`` answered through grpc.aio
cost 226 µs of server CPU at 32 concurrent calls, 44 µs framed by hand on the event loop
(docs/benchmarks.md, "Stop 26"). This module is the HTTP/2 half of that front; the gRPC half
(messages, status, deadlines, the servicer) is :mod:`gateway.grpc_front`. Header blocks are
decoded by python-hyper's ``hpack`` (RFC 7541); the blocks this side sends are literals
without indexing (RFC 7541 §6.2.2), so no encoder state is kept and the peer's table size
does not matter.

What a connection does (section numbers of RFC 9113):

- the client preface (§3.4) within ``handshake_timeout_s``, else the connection is closed;
  this side's SETTINGS (§6.5) first: concurrent streams, the initial stream window, the
  largest header list; a connection window raised to :data:`CONNECTION_WINDOW`;
- HEADERS and CONTINUATION (§6.2, §6.10) into one header block, padding and priority
  removed; a new odd stream id above the last one opens a stream (past the concurrent-stream
  bound: ``RST_STREAM`` REFUSED_STREAM), given to ``on_stream``; a header block on an open
  stream is its trailers;
- DATA (§6.1) to the stream's receiver; the connection window is given back as DATA
  arrives, the stream's window when the receiver has taken the bytes (:meth:`Stream.consumed`),
  so an unread stream stops its sender (§5.2); either only once half of it is spent
  (:data:`UPDATE_AT`, as nghttp2 and h2o do): a unary call's request, far below that,
  costs no WINDOW_UPDATE, so the client is not woken once more per call;
- the peer's windows (§6.9) and largest frame size bound what :meth:`Stream.send_data`
  writes; it waits for ``WINDOW_UPDATE`` when a window is spent;
- frames written in one turn of the event loop (the answers of a batch's calls, the
  acknowledgements of one read) leave in one ``send``;
- PING is answered (§6.7), PRIORITY and unknown frame types ignored (§5.5), PUSH_PROMISE from
  a client is a PROTOCOL_ERROR; ``RST_STREAM`` ends the stream (its receiver is told);
  GOAWAY from the peer closes the connection once its streams are done;
- any protocol violation is a connection error: GOAWAY with its code (§5.4.1), every stream
  reset, the transport closed;
- a peer that does not read is not read either (the transport's write buffer past its high
  mark pauses reading): what it sends cannot pile answers, PING or SETTINGS acknowledgements
  up in memory;
- no stream open for ``idle_timeout_s``: GOAWAY NO_ERROR and close (as grpc core's
  ``max_connection_idle``); :meth:`Http2Connection.go_away` refuses new streams and closes
  once the open ones are done (a server stopping).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import hpack
import hpack.exceptions

logger = logging.getLogger(__name__)
# hpack logs every header it decodes at DEBUG, values included: credentials (``authorization``)
# would reach a verbose gateway's log, and each request would pay for the records.
logging.getLogger("hpack").setLevel(logging.WARNING)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# Frame types (§6) and flags.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING = range(7)
GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x7, 0x8, 0x9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# Error codes (§7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB
# Settings (§6.5.2).
SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE = 0x3, 0x4
SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 0x5, 0x6

#: The initial window of either side (§6.9.2) and the largest a window may be (§6.9.1).
DEFAULT_WINDOW, MAX_WINDOW = 65_535, 2**31 - 1
#: The frame size every peer accepts (§4.2); this side advertises no larger.
FRAME_SIZE = 16_384
#: This side's connection receive window, given back as DATA arrives.
CONNECTION_WINDOW = 16 * 2**20
#: This side's initial stream receive window (SETTINGS_INITIAL_WINDOW_SIZE).
STREAM_WINDOW = 4 * 2**20
#: Part of a receive window spent before it is given back (one WINDOW_UPDATE for the lot).
UPDATE_AT = 0.5
_HEAD = struct.Struct(">BBI")  # after the 3-byte length: type, flags, stream id


class Receiver(Protocol):
    """What a stream's body and end are given to (:mod:`gateway.grpc_front`'s call)."""

    def data_received(self, data: bytes) -> None: ...
    def end_received(self) -> None: ...
    def reset_received(self) -> None: ...


@dataclass(frozen=True)
class Http2Limits:
    """``max_streams`` open at once per connection, ``max_header_list`` bytes of headers
    (decoded, RFC 9113 §6.5.2's size), the preface's and an idle connection's timeouts."""

    max_streams: int = 1000
    max_header_list: int = 16 * 1024
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0


class ConnectionError(Exception):  # noqa: A001 - RFC 9113's name, scoped to this module
    """A connection error (§5.4.1): the connection ends with GOAWAY ``code``."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview = b"") -> bytes:
    """One frame: its 9-byte header (§4.1) and ``payload``."""
    return len(payload).to_bytes(3, "big") + _HEAD.pack(kind, flags, stream_id) + payload


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) with ``first``'s high bits before a
    ``prefix_bits``-bit prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out, value = bytearray((first | limit,)), value - limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def header_block(headers: list[tuple[str, str]]) -> bytes:
    """``headers`` as an HPACK block of literal fields without indexing, new names, no
    Huffman coding (RFC 7541 §6.2.2): nothing enters either side's dynamic table."""
    out = bytearray()
    for name, value in headers:
        raw_name, raw_value = name.encode("ascii"), value.encode("latin-1")
        out += b"\x00" + _integer(len(raw_name), 7, 0) + raw_name + _integer(len(raw_value), 7, 0) + raw_value
    return bytes(out)


class Stream:
    """One stream of a connection: what was received for it and the answer's sending side."""

    def __init__(self, connection: Http2Connection, stream_id: int, send_window: int):
        self.connection, self.id = connection, stream_id
        self.send_window = send_window
        self.receiver: Receiver | None = None
        self.remote_closed = self.local_closed = self.reset = False
        self.unacknowledged = 0  # bytes received and not given back to the stream's window
        self.taken = 0  # of those, bytes the receiver has taken (given back together)

    def consumed(self, n: int) -> None:
        """The receiver took ``n`` bytes: give them back to this stream's window (a
        WINDOW_UPDATE) once half the window is taken and the peer may still send."""
        self.taken += n
        if self.taken >= STREAM_WINDOW * UPDATE_AT and not self.remote_closed and not self.reset:
            self.unacknowledged -= self.taken
            self.connection.write(frame(WINDOW_UPDATE, 0, self.id, self.taken.to_bytes(4, "big")))
            self.taken = 0

    def send_headers(self, block: bytes, end_stream: bool = False) -> None:
        """Write a header block (response headers, or trailers with ``end_stream``)."""
        if not self.reset and not self.local_closed:
            self.connection.write(self.connection.headers_frames(self.id, block, end_stream))
            self._sent_end(end_stream)

    def can_send_now(self, n: int) -> bool:
        """``n`` bytes of DATA fit both windows and one frame: :meth:`send_all` writes them at once."""
        connection = self.connection
        return n <= self.send_window and n <= connection.send_window and n <= connection.peer_frame_size

    def send_all(self, head: bytes, data: bytes, trailers: bytes) -> None:
        """Headers, one DATA frame and trailers in one write (check :meth:`can_send_now` first)."""
        if self.reset or self.local_closed:
            return
        connection = self.connection
        self.send_window -= len(data)
        connection.send_window -= len(data)
        connection.write(
            connection.headers_frames(self.id, head, False)
            + frame(DATA, 0, self.id, data)
            + connection.headers_frames(self.id, trailers, True)
        )
        self._sent_end(True)

    async def send_data(self, data: bytes, end_stream: bool = False) -> None:
        """Write ``data`` as DATA frames as the peer's windows allow, waiting for them to open.
        Raises :class:`ConnectionResetError` when the stream is reset or its connection lost."""
        connection, view = self.connection, memoryview(data)
        while True:
            if self.reset or self.local_closed or connection.transport is None:
                raise ConnectionResetError("the stream was reset or its connection lost")
            n = min(len(view), self.send_window, connection.send_window, connection.peer_frame_size)
            if n > 0 or not view:
                last = end_stream and n == len(view)
                self.send_window -= n
                connection.send_window -= n
                connection.write(frame(DATA, END_STREAM if last else 0, self.id, view[:n]))
                view = view[n:]
                self._sent_end(last)
                if not view:
                    return
            else:
                await connection.window_opened()
            await connection.drained()

    def reset_stream(self, code: int = CANCEL) -> None:
        """End the stream at once (RST_STREAM ``code``)."""
        if not self.reset:
            self.reset = True
            self.connection.write(frame(RST_STREAM, 0, self.id, code.to_bytes(4, "big")))
            self.connection.forget(self)

    def _sent_end(self, end_stream: bool) -> None:
        if end_stream:
            self.local_closed = True
            if not self.remote_closed:  # the client may still send: it need not (RFC 9113 §8.1)
                self.reset_stream(NO_ERROR)
            self.connection.forget(self)


class HeaderDecoder:
    """HPACK decoding (RFC 7541, python-hyper's ``hpack``) of one connection's header blocks,
    each value read as Latin-1 (one char a byte), that skips a block it decoded last time when
    that decoding left the dynamic table as it was. A client's repeated calls send the same
    bytes once its table holds their fields (indexed representations only, RFC 7541 §6.1):
    decoding depends only on the bytes and the table (§2.3, §3), so the same bytes on the same
    table give the same list. Any block that changes the table (an insertion, §6.2.1; a size
    update, §6.3) forgets the remembered one."""

    def __init__(self, max_header_list_size: int) -> None:
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = max_header_list_size
        self._block: bytes | None = None
        self._headers: list[tuple[str, str]] = []

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        """The block's header list (a fresh list). Raises hpack's errors."""
        if block == self._block:
            return list(self._headers)
        table = self.decoder.header_table
        before = self._state(table)
        self._block = None  # a decode that raises midway may have changed the table
        raw = self.decoder.decode(block, raw=True)
        headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in raw]
        if self._same(before, self._state(table)):
            self._block, self._headers = block, headers
        return list(headers)

    @staticmethod
    def _state(table: Any) -> tuple:  # hpack.table.HeaderTable
        entries = table.dynamic_entries
        return (entries[0] if entries else None, len(entries), table.maxsize)

    @staticmethod
    def _same(a: tuple, b: tuple) -> bool:
        return a[0] is b[0] and a[1:] == b[1:]  # the newest entry by identity: every insertion is a new tuple


class Http2Connection(asyncio.Protocol):
    """One client connection. ``on_stream(stream, headers)`` is called for each new stream
    with its decoded header list (name, value) and returns the stream's :class:`Receiver`."""

    def __init__(self, on_stream: Callable[[Stream, list[tuple[str, str]]], Receiver], limits: Http2Limits):
        self.on_stream, self.limits = on_stream, limits
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.last_stream_id = 0
        self.send_window, self.peer_window, self.peer_frame_size = DEFAULT_WINDOW, DEFAULT_WINDOW, FRAME_SIZE
        self.receive_window = CONNECTION_WINDOW  # what the peer may still send
        self.closing = False
        self._buffer, self._preface = bytearray(), False
        self._block: tuple[int, int, bytearray] | None = None  # a header block awaiting CONTINUATION
        # A list over max_header_list is the call's error (gateway.grpc_front); only one far
        # past it ends the connection (the decoder's table must stay whole: it cannot stop midway).
        self._decoder = HeaderDecoder(4 * limits.max_header_list)
        self._out: list[bytes] | None = None  # frames to write at the loop's next turn (:meth:`write`)
        self._window_waiters: list[asyncio.Future[None]] = []
        self._paused: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # -- the transport's side ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        settings = struct.pack(
            ">HIHIHI", SETTINGS_MAX_CONCURRENT_STREAMS, self.limits.max_streams, SETTINGS_INITIAL_WINDOW_SIZE,
            STREAM_WINDOW, SETTINGS_MAX_HEADER_LIST_SIZE, self.limits.max_header_list,
        )  # fmt: skip
        increment = (CONNECTION_WINDOW - DEFAULT_WINDOW).to_bytes(4, "big")
        self.write(frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, increment))
        self._arm(self.limits.handshake_timeout_s)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._out is None:
            self._out = []
        try:
            if not self._preface:
                if len(self._buffer) < len(PREFACE):
                    if not PREFACE.startswith(bytes(self._buffer)):
                        raise ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 client preface")
                    return
                if self._buffer[: len(PREFACE)] != PREFACE:
                    raise ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 client preface")
                del self._buffer[: len(PREFACE)]
                self._preface = True
                self._idle()
            self._frames()
        except ConnectionError as exc:
            self._fail(exc)
        finally:
            self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._out = None
        if self._timer is not None:
            self._timer.cancel()
        for stream in list(self.streams.values()):
            self._reset_received(stream)
        self._wake(self._window_waiters)
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)
        self.transport = None

    def pause_writing(self) -> None:
        """The peer does not read what is written: stop reading from it too, so nothing it
        sends (requests, PINGs, SETTINGS) makes this side hold more answers in memory."""
        if self._paused is None or self._paused.done():
            self._paused = asyncio.get_running_loop().create_future()
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # -- what streams use ----------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Send ``data`` with everything else written in this turn of the event loop: one
        ``send`` for the answers of a batch's calls (each woken by the same reply) and the
        acknowledgements of one read, where each would cost a system call and a wake-up of
        the client's reader."""
        if self._out is None:
            if self.transport is None:
                return
            self._out = []
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(data)

    def close(self) -> None:
        """Write what is gathered, then close the transport (it sends what it buffers first)."""
        self._flush()
        if self.transport is not None:
            self.transport.close()

    def headers_frames(self, stream_id: int, block: bytes, end_stream: bool) -> bytes:
        """HEADERS (and CONTINUATION past the peer's frame size) carrying ``block``."""
        size = self.peer_frame_size
        flags = END_STREAM if end_stream else 0
        if len(block) <= size:
            return frame(HEADERS, flags | END_HEADERS, stream_id, block)
        parts = [block[i : i + size] for i in range(0, len(block), size)]
        out = frame(HEADERS, flags, stream_id, parts[0])
        for i, part in enumerate(parts[1:], 2):
            out += frame(CONTINUATION, END_HEADERS if i == len(parts) else 0, stream_id, part)
        return out

    async def window_opened(self) -> None:
        """Return after the next WINDOW_UPDATE or SETTINGS (or when the connection is lost)."""
        if self.transport is None:
            raise ConnectionResetError("the connection was lost")
        waiter = asyncio.get_running_loop().create_future()
        self._window_waiters.append(waiter)
        await waiter

    async def drained(self) -> None:
        """Return when the transport takes writes again (it paused: a slow reader)."""
        if self._paused is not None and not self._paused.done():
            await self._paused
        if self.transport is None:
            raise ConnectionResetError("the connection was lost")

    def forget(self, stream: Stream) -> None:
        """``stream`` is done on both sides, or reset: it no longer counts as open."""
        done = stream.reset or (stream.local_closed and stream.remote_closed)
        if done:
            stream.receiver = None  # the call and its buffers go with their task, not a GC pass
        if done and self.streams.pop(stream.id, None) is not None and not self.streams:
            self._idle()

    def go_away(self, code: int = NO_ERROR) -> None:
        """Refuse new streams (GOAWAY ``code``) and close once the open ones are done."""
        if self.transport is None or self.closing:
            return
        self.closing = True
        self.write(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_stream_id, code)))
        if not self.streams:
            self.close()

    # -- reading frames ------------------------------------------------------------------------

    def _frames(self) -> None:
        buffer, at = self._buffer, 0
        try:
            while len(buffer) - at >= 9:
                length = int.from_bytes(buffer[at : at + 3], "big")
                if length > FRAME_SIZE:
                    raise ConnectionError(FRAME_SIZE_ERROR, f"a frame of {length} bytes, over {FRAME_SIZE}")
                if len(buffer) - at < 9 + length:
                    break
                kind, flags, stream_id = _HEAD.unpack_from(buffer, at + 3)
                payload = bytes(buffer[at + 9 : at + 9 + length])
                at += 9 + length
                self._frame(kind, flags, stream_id & 0x7FFF_FFFF, payload)
        finally:
            del buffer[:at]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is not None and kind != CONTINUATION:
            raise ConnectionError(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == RST_STREAM:
            stream = self.streams.get(stream_id)
            if stream_id == 0 or len(payload) != 4:
                raise ConnectionError(FRAME_SIZE_ERROR if stream_id else PROTOCOL_ERROR, "a bad RST_STREAM")
            if stream is not None:
                self._reset_received(stream)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == PING:
            if stream_id != 0 or len(payload) != 8:
                raise ConnectionError(PROTOCOL_ERROR, "a bad PING")
            if not flags & ACK:
                self.write(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            self.closing = True
            if not self.streams:
                self.close()
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PUSH_PROMISE:
            raise ConnectionError(PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
        # PRIORITY and unknown types are ignored (§5.3.2, §5.5)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        self.receive_window -= len(payload)
        if self.receive_window < 0:
            raise ConnectionError(FLOW_CONTROL_ERROR, "DATA past the connection window")
        spent = CONNECTION_WINDOW - self.receive_window  # given back as it arrives; a stream's as read
        if spent >= CONNECTION_WINDOW * UPDATE_AT:
            self.receive_window = CONNECTION_WINDOW
            self.write(frame(WINDOW_UPDATE, 0, 0, spent.to_bytes(4, "big")))
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if stream_id > self.last_stream_id:
                raise ConnectionError(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream this side ended or reset: dropped (§5.1)
        body = _unpad(flags, payload)
        stream.unacknowledged += len(payload)
        if stream.unacknowledged > STREAM_WINDOW:
            stream.reset_stream(FLOW_CONTROL_ERROR)
            self._reset_received(stream)
            return
        if len(payload) > len(body):
            stream.consumed(len(payload) - len(body))  # padding is given back at once
        if stream.receiver is not None and body:
            stream.receiver.data_received(body)
        if flags & END_STREAM:
            self._end_received(stream)

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = _unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            block = block[5:]
        self._block = (stream_id, flags, bytearray(block))
        if flags & END_HEADERS:
            self._header_block()

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is None or self._block[0] != stream_id:
            raise ConnectionError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self._block[2].extend(payload)
        if len(self._block[2]) > 4 * self.limits.max_header_list + FRAME_SIZE:
            raise ConnectionError(ENHANCE_YOUR_CALM, "a header block past the header list size")
        if flags & END_HEADERS:
            self._header_block()

    def _header_block(self) -> None:
        assert self._block is not None
        stream_id, flags, block = self._block
        self._block = None
        try:
            # Bytes, read as Latin-1 (one char a byte): a value that is not UTF-8 is the call's
            # problem (its metadata), not a reason to end the connection and everyone's calls.
            headers = self._decoder.decode(bytes(block))
        except hpack.exceptions.OversizedHeaderListError:
            raise ConnectionError(ENHANCE_YOUR_CALM, "a header list over its limit") from None
        except hpack.exceptions.HPACKError as exc:
            raise ConnectionError(COMPRESSION_ERROR, f"a header block that does not decode: {exc}") from None
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers
            if not flags & END_STREAM:
                raise ConnectionError(PROTOCOL_ERROR, "a second header block without END_STREAM")
            self._end_received(stream)
            return
        if stream_id <= self.last_stream_id:
            return  # a stream that ended already (reset by this side): dropped
        if stream_id % 2 == 0:
            raise ConnectionError(PROTOCOL_ERROR, "a client opened an even stream")
        self.last_stream_id = stream_id
        if self.closing or len(self.streams) >= self.limits.max_streams:
            self.write(frame(RST_STREAM, 0, stream_id, REFUSED_STREAM.to_bytes(4, "big")))
            return
        stream = Stream(self, stream_id, self.peer_window)
        self.streams[stream_id] = stream
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        stream.receiver = self.on_stream(stream, headers)
        if flags & END_STREAM:
            self._end_received(stream)

    def _end_received(self, stream: Stream) -> None:
        stream.remote_closed = True
        if stream.receiver is not None:
            stream.receiver.end_received()
        self.forget(stream)

    def _reset_received(self, stream: Stream) -> None:
        stream.reset = True
        self.streams.pop(stream.id, None)
        receiver, stream.receiver = stream.receiver, None
        if receiver is not None:
            receiver.reset_received()
        self._wake(self._window_waiters)
        if not self.streams:
            self._idle()

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0 or len(payload) % 6:
            raise ConnectionError(PROTOCOL_ERROR if stream_id else FRAME_SIZE_ERROR, "a bad SETTINGS frame")
        if flags & ACK:
            return
        for at in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, at)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1")
                for stream in self.streams.values():
                    stream.send_window += value - self.peer_window
                self.peer_window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not FRAME_SIZE <= value <= 2**24 - 1:
                    raise ConnectionError(PROTOCOL_ERROR, "a bad SETTINGS_MAX_FRAME_SIZE")
                self.peer_frame_size = value
        self.write(frame(SETTINGS, ACK, 0))
        self._wake(self._window_waiters)

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError(FRAME_SIZE_ERROR, "a bad WINDOW_UPDATE")
        increment = int.from_bytes(payload, "big") & 0x7FFF_FFFF
        if stream_id == 0:
            if increment == 0 or self.send_window + increment > MAX_WINDOW:
                raise ConnectionError(FLOW_CONTROL_ERROR if increment else PROTOCOL_ERROR, "a bad window")
            self.send_window += increment
        elif (stream := self.streams.get(stream_id)) is not None:
            if increment == 0 or stream.send_window + increment > MAX_WINDOW:
                stream.reset_stream(PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR)
                self._reset_received(stream)
                return
            stream.send_window += increment
        self._wake(self._window_waiters)

    # -- timers and errors ---------------------------------------------------------------------

    def _idle(self) -> None:
        """No stream is open: close after the idle timeout (or now, when going away)."""
        if self.closing:
            self.close()
            return
        self._arm(self.limits.idle_timeout_s)

    def _arm(self, timeout_s: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self._timed_out)

    def _timed_out(self) -> None:
        self._timer = None
        if not self._preface:
            self.close()
        elif not self.streams:
            self.go_away(NO_ERROR)

    def _fail(self, error: ConnectionError) -> None:
        logger.debug("HTTP/2 connection error %#x: %s", error.code, error)
        reason = struct.pack(">II", self.last_stream_id, error.code) + str(error).encode()
        self.write(frame(GOAWAY, 0, 0, reason))
        self.closing = True
        self.close()

    def _flush(self) -> None:
        out, self._out = self._out, None
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    @staticmethod
    def _wake(waiters: list[asyncio.Future[None]]) -> None:
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        waiters.clear()


def _unpad(flags: int, payload: bytes) -> bytes:
    """``payload`` without its padding (§6.1); a pad longer than the frame is a PROTOCOL_ERROR."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ConnectionError(PROTOCOL_ERROR, "padding past the frame")
    return payload[1 : len(payload) - payload[0]]
