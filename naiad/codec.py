"""The queue wire codec: a msgpack header plus the tensors' raw bytes. Never pickle.

A request is one Redis stream entry with two fields: ``h`` (msgpack header) and ``d`` (the
inputs' raw bytes concatenated in header order). A reply is one msgpack array
``[header, raw]``; a worker pushes the replies of one batch for one gateway as one element
of that gateway's reply list, the encoded replies concatenated (:func:`decode_replies`).
Tensor bytes are little-endian and row-major; BYTES tensors use Triton's 4-byte length-prefixed elements
(:func:`naiad.datatypes.serialize_bytes`), so nothing on the hot path goes through JSON.

Request header keys: ``q`` queue id (unique per enqueue), ``id`` client request id, ``v``
model version, ``r`` reply list key, ``dl`` deadline (Unix seconds, float), ``t`` enqueue
time (Unix seconds), ``in`` list of ``[name, datatype, shape, nbytes]``, ``out`` requested
output names, ``p`` request parameters, ``ra`` (optional) ``[socket path, token]`` of the
gateway's direct reply channel (:mod:`naiad.reply_channel`), ``rid`` (optional) the id logs
and traces give the request (the client's ``id``, or one the gateway made up when it sent none;
:mod:`naiad.logs`), and optionally ``tp``: the W3C ``traceparent``
of the gateway's span when tracing is on (:mod:`naiad.tracing`; absent otherwise, and a
worker treats a missing or malformed one as no trace).
Reply header keys: ``q``, ``ok`` bool, ``e`` ``[error class name, message]`` when not ok,
``out`` list of ``[name, datatype, shape, nbytes]``, ``st`` worker timings (ns) by phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from naiad.datatypes import from_bytes, to_bytes
from naiad.errors import InvalidInput, NaiadError, error_from_name
from naiad.inference import InferRequest, RequestedOutput, Tensor
from naiad.memo import remember

HEADER = b"h"
DATA = b"d"


@dataclass
class QueuedRequest:
    """A request as a worker sees it after decoding a stream entry."""

    queue_id: str
    request: InferRequest
    reply_to: str
    deadline: float
    enqueued_at: float
    entry_id: bytes = b""
    traceparent: str | None = None
    log_id: str = ""
    reply_address: tuple[str, str] | None = None
    """The gateway's direct reply channel (:mod:`naiad.reply_channel`), when it has one."""
    level: int = 0
    """The priority level of the stream it was read from (set by the reader, not sent)."""
    claimed_at: float = 0.0
    """``time.monotonic()`` when the read that claimed it was sent (set by the reader)."""
    deliveries: int = 1
    """Times Redis delivered its entry to a worker, this claim included (set by the reader):
    more than 1 for one reclaimed from a worker that died (:mod:`workers.reclaim`)."""

    @property
    def request_id(self) -> str:
        """The id logs and traces use: the gateway's ``rid``, else the client's, else ours."""
        return self.log_id or self.request.id or self.queue_id


@dataclass
class Reply:
    """A worker's answer: either ``outputs`` or ``error``; ``timings_ns`` by phase."""

    queue_id: str
    outputs: list[Tensor] = field(default_factory=list)
    error: NaiadError | None = None
    timings_ns: dict[str, int] = field(default_factory=dict)


def _pack_tensors(tensors: list[Tensor]) -> tuple[list[list[Any]], bytes]:
    specs, chunks = [], []
    for tensor in tensors:
        raw = to_bytes(tensor.data, tensor.datatype)
        specs.append([tensor.name, tensor.datatype, list(tensor.shape), len(raw)])
        chunks.append(raw)
    return specs, b"".join(chunks)


#: Most dimensions a queued tensor may have (the gateways accept at most 64).
MAX_DIMS = 64


def _valid_shape(shape: Any) -> bool:
    """A list of at most :data:`MAX_DIMS` integers in 0..2**63-1 (checked before any
    arithmetic: ``math.prod([2**40, "a"])`` would build a 1 TiB string)."""
    return (
        isinstance(shape, list)
        and len(shape) <= MAX_DIMS
        and all(type(d) is int and 0 <= d < 2**63 for d in shape)
    )


#: Fixed-size tensor specs found valid, ``(name, datatype, nbytes, *shape)`` → their wire
#: dtype and shape: the same spec again (every reply of a model, nearly) skips the checks
#: (a spec that only compares equal, as ``1.0`` or ``True`` for ``1``, gets the valid one's
#: integers). Emptied when it holds :data:`MAX_REMEMBERED_SPECS`.
_valid_specs: dict[tuple[Any, ...], tuple[Any, tuple[int, ...]]] = {}
MAX_REMEMBERED_SPECS = 1024


def _unpack_tensors(specs: list[list[Any]], raw: bytes) -> list[Tensor]:
    tensors, offset = [], 0
    view = memoryview(raw)
    for name, datatype, shape, nbytes in specs:
        try:
            key: tuple[Any, ...] | None = (name, datatype, nbytes, *shape)
            known = _valid_specs.get(key)
        except TypeError:  # a shape that is no list of integers: checked below
            key, known = None, None
        if known is not None and offset + nbytes <= len(view):
            dtype, dims = known
            data = np.frombuffer(view[offset : offset + nbytes], dtype=dtype).reshape(dims)
            shape = list(dims)
        else:
            data = _checked_tensor(name, datatype, shape, nbytes, view, offset)
            if key is not None and datatype != "BYTES":
                remember(_valid_specs, key, (data.dtype, tuple(shape)), MAX_REMEMBERED_SPECS)
            shape = list(shape)
        tensors.append(Tensor(name, datatype, shape, data))
        offset += nbytes
    if offset != len(view):
        raise InvalidInput("queue message carries bytes its header does not describe")
    return tensors


def _checked_tensor(name: Any, datatype: Any, shape: Any, nbytes: Any, view: memoryview, offset: int) -> Any:
    if not isinstance(nbytes, int) or nbytes < 0 or offset + nbytes > len(view):
        raise InvalidInput("queue message is shorter than its header says")
    if not isinstance(name, str) or not isinstance(datatype, str) or not _valid_shape(shape):
        raise InvalidInput("queue message has a malformed tensor spec")
    return from_bytes(view[offset : offset + nbytes], datatype, shape)


def encode_request(
    queue_id: str, request: InferRequest, reply_to: str, deadline: float, now: float,
    traceparent: str | None = None, log_id: str = "", reply_address: tuple[str, str] | None = None,
) -> dict[bytes, bytes]:
    """Stream-entry fields for ``request``; see the module doc for the header keys."""
    specs, raw = _pack_tensors(request.inputs)
    header = {
        "q": queue_id,
        "id": request.id,
        "v": request.version,
        "r": reply_to,
        "dl": deadline,
        "t": now,
        "in": specs,
        "out": [output.name for output in request.outputs],
        "p": request.parameters,
    }
    if log_id and log_id != request.id:
        header["rid"] = log_id
    if traceparent:
        header["tp"] = traceparent
    if reply_address:
        header["ra"] = reply_address
    return {HEADER: pack_request_values(header), DATA: raw}


def pack_request_values(value: Any) -> bytes:
    """msgpack of ``value``, which holds a client's request parameters (and ids). Raises
    :class:`InvalidInput` for what msgpack cannot encode: an integer past 64 bits, a string
    with a lone surrogate (JSON allows both)."""
    try:
        return msgpack.packb(value)
    except (OverflowError, TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidInput(f"request parameters cannot be encoded: {exc}") from None


def decode_request(model: str, fields: dict[bytes, bytes], entry_id: bytes = b"") -> QueuedRequest:
    """Inverse of :func:`encode_request`. Raises :class:`InvalidInput` on a malformed entry."""
    try:
        header = msgpack.unpackb(fields[HEADER])
        inputs = _unpack_tensors(header["in"], fields.get(DATA, b""))
        request = InferRequest(
            model=model,
            version=int(header["v"]),
            inputs=inputs,
            outputs=[RequestedOutput(name) for name in header["out"]],
            id=header["id"],
            parameters=header["p"],
        )
        traceparent, log_id, address = header.get("tp"), header.get("rid"), header.get("ra")
        return QueuedRequest(
            header["q"], request, header["r"], float(header["dl"]), float(header["t"]), entry_id,
            traceparent if isinstance(traceparent, str) else None,
            log_id if isinstance(log_id, str) else "",
            _address(address),
        )
    except (KeyError, TypeError, ValueError, OverflowError, msgpack.UnpackException) as exc:
        raise InvalidInput(f"malformed queue message: {exc}") from exc


def _address(value: Any) -> tuple[str, str] | None:
    """A header's ``ra``: ``(path, token)``, or None when absent or not two strings."""
    if isinstance(value, list | tuple) and len(value) == 2 and type(value[0]) is type(value[1]) is str:
        return value[0], value[1]
    return None


def entry_order(entry_id: bytes) -> tuple[int, int]:
    """A stream entry id ``<ms>-<seq>`` as numbers: the order Redis accepted entries in."""
    ms, _, seq = entry_id.partition(b"-")
    return int(ms or 0), int(seq or 0)


def encode_reply(reply: Reply) -> bytes:
    """One msgpack value ``[header, raw]`` for the gateway's reply list."""
    header: dict[str, Any] = {"q": reply.queue_id, "ok": reply.error is None, "st": reply.timings_ns}
    raw = b""
    if reply.error is not None:
        header["e"] = [type(reply.error).__name__, reply.error.message]
    else:
        header["out"], raw = _pack_tensors(reply.outputs)
    return msgpack.packb([header, raw])


def decode_reply(payload: bytes) -> Reply:
    """Inverse of :func:`encode_reply`. Raises :class:`InvalidInput` on a malformed reply."""
    try:
        return _reply_of(msgpack.unpackb(payload))
    except (ValueError, msgpack.UnpackException) as exc:
        raise InvalidInput(f"malformed reply message: {exc}") from exc


def decode_replies(payload: bytes) -> list[Reply]:
    """The replies of one reply-list element: encoded replies (:func:`encode_reply`)
    concatenated, as a worker pushes every reply of a batch for one gateway (one is the
    plain case). Raises :class:`InvalidInput` if any is malformed."""
    try:  # one reply (a lone request's): no streaming unpacker
        return [_reply_of(msgpack.unpackb(payload))]
    except msgpack.ExtraData:
        pass  # several replies
    except (ValueError, msgpack.UnpackException) as exc:
        raise InvalidInput(f"malformed reply message: {exc}") from exc
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(payload), 1))
    replies, end = [], 0
    try:
        unpacker.feed(payload)
        for value in unpacker:
            replies.append(_reply_of(value))
            end = unpacker.tell()  # after a whole value (a cut one still advances tell())
    except (ValueError, msgpack.UnpackException) as exc:
        raise InvalidInput(f"malformed reply message: {exc}") from exc
    if not replies or end != len(payload):
        raise InvalidInput("malformed reply message: truncated")
    return replies


def _reply_of(value: Any) -> Reply:
    try:
        header, raw = value
        reply = Reply(header["q"], timings_ns=header.get("st", {}))
        if header["ok"]:
            reply.outputs = _unpack_tensors(header["out"], raw)
        else:
            reply.error = error_from_name(*header["e"])
        return reply
    except (KeyError, TypeError, ValueError, OverflowError, msgpack.UnpackException) as exc:
        raise InvalidInput(f"malformed reply message: {exc}") from exc


def encode_tensors(tensors: list[Tensor]) -> bytes:
    """One msgpack value ``[specs, raw]`` for ``tensors`` (the reply's layout without its
    header): what the response cache stores."""
    specs, raw = _pack_tensors(tensors)
    return msgpack.packb([specs, raw])


def decode_tensors(payload: bytes) -> list[Tensor]:
    """Inverse of :func:`encode_tensors`. Raises :class:`InvalidInput` on a malformed value."""
    try:
        specs, raw = msgpack.unpackb(payload)
        return _unpack_tensors(specs, raw)
    except (TypeError, ValueError, OverflowError, msgpack.UnpackException) as exc:
        raise InvalidInput(f"malformed cached tensors: {exc}") from exc
