"""Triton's system shared memory extension: regions a client on the gateway's host registers,
then names in its requests instead of sending tensor bytes.

Protocol: Triton ``docs/protocol/extension_shared_memory.md`` (the ``shared_memory_region``,
``shared_memory_byte_size``, ``shared_memory_offset`` tensor parameters; register, unregister,
status) and, for behaviour and wording, Triton 2.51's ``src/shared_memory_manager.cc``,
``http_server.cc`` and ``grpc/grpc_utils.h``. Transport-free: the HTTP and gRPC adapters
convert and call :class:`SystemSharedMemory`; the codecs read inputs through it and the data
plane writes outputs through it (after the response cache, so a cached answer still fills
its region).

A region is ``byte_size`` bytes at ``offset`` in a POSIX shared memory object ``key`` (what
``shm_open(key)`` opens: ``/dev/shm/<key without leading slashes>`` on Linux, as
``tritonclient.utils.shared_memory`` creates it). Registrations belong to one gateway process,
as Triton's belong to one server: they are host-local by nature (the memory is on this host)
and end with the process; a client must register with the gateway it sends requests to.
A request offset is relative to the region's start (the spec's meaning).
"""

from __future__ import annotations

import contextlib
import os
import stat
import weakref
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from naiad.datatypes import element_count, from_bytes, numpy_dtype, to_bytes
from naiad.errors import AlreadyExists, InvalidInput, PayloadTooLarge, RegionNotFound, Unsupported
from naiad.inference import InferRequest, InferResponse, SharedMemoryRef

#: Where Linux's ``shm_open`` keeps its objects (glibc: ``/dev/shm/<name>``).
SHM_ROOT = "/dev/shm"
#: Most regions one gateway holds registered at a time (each is one mapping).
MAX_REGIONS = 1024
#: The tensor parameters of the extension.
REGION, BYTE_SIZE, OFFSET = "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"
#: What a client gets for anything CUDA shared memory (both transports).
CUDA_UNSUPPORTED = (
    "CUDA shared memory is not supported by this server (Naiad's workers run in other "
    "processes, possibly on other hosts); use system shared memory or send the tensors"
)


def _unsigned(value: Any, what: str, tensor: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise InvalidInput(
            f"invalid value for '{what}' of tensor '{tensor}': expected a non-negative integer"
        )
    return value


def shared_memory_ref(parameters: Mapping[str, Any], tensor: str) -> SharedMemoryRef | None:
    """The region an input or requested output names in its ``parameters``, None if none.

    Raises :class:`InvalidInput` (Triton's ``ParseSharedMemoryParams`` rules) when the region
    is not a string, an offset or size is not a non-negative integer, offset or size come
    without a region, or the region comes without its size (the spec requires both).
    """
    if not parameters:
        return None
    region = parameters.get(REGION)
    if region is None:
        for what in (OFFSET, BYTE_SIZE):
            if what in parameters:
                raise InvalidInput(
                    f"'{what}' can not be specified without '{REGION}' parameter for tensor '{tensor}'"
                )
        return None
    if not isinstance(region, str):
        raise InvalidInput(
            f"invalid value type for '{REGION}' parameter for tensor '{tensor}', expected a string"
        )
    if BYTE_SIZE not in parameters:
        raise InvalidInput(f"'{BYTE_SIZE}' must be given with '{REGION}' for tensor '{tensor}'")
    size = _unsigned(parameters[BYTE_SIZE], BYTE_SIZE, tensor)
    return SharedMemoryRef(region, size, _unsigned(parameters.get(OFFSET, 0), OFFSET, tensor))


def _shm_path(key: str) -> str:
    """The file ``shm_open(key)`` opens; InvalidInput for a key it would refuse."""
    name = key.lstrip("/")
    if not name or "/" in name or name in (".", "..") or "\0" in name or len(name) > 255:
        raise InvalidInput(f"Unable to open shared memory region: '{key}'")
    return os.path.join(SHM_ROOT, name)


def _open(name: str, key: str, offset: int, byte_size: int) -> int:
    """Object ``key`` opened read-write, checked to hold ``offset + byte_size`` bytes now.

    The region is read and written through this descriptor (``os.pread``/``os.pwrite``), not a
    memory mapping: a client that shrinks the object after registering it would make a mapped
    access raise SIGBUS and kill the gateway; a short read or a size checked before each write
    is an error of that request alone."""
    try:
        fd = os.open(_shm_path(key), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise InvalidInput(f"Unable to open shared memory region: '{key}'") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(f"Invalid shared memory region: '{key}'")
        if byte_size == 0 or offset + byte_size > info.st_size:
            raise InvalidInput(
                f"failed to register shared memory region '{name}': invalid args (offset {offset} "
                f"+ byte_size {byte_size} must be within the {info.st_size} bytes of '{key}', "
                "byte_size > 0)"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _shrunk(region: str) -> InvalidInput:
    return InvalidInput(f"shared memory region '{region}' is smaller than when it was registered")


@dataclass
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    users: int = 0
    closer: weakref.finalize | None = None  # closes ``fd`` once: unregister, close, or collection

    def close(self) -> None:
        if self.closer is not None:
            self.closer()

    def descriptor(self) -> int:
        """The open descriptor; ValueError once closed (unregistered)."""
        if self.closer is None or not self.closer.alive:
            raise ValueError("closed")
        return self.fd

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class SystemSharedMemory:
    """The regions registered with this gateway process (Triton's ``SharedMemoryManager``
    for ``TRITONSERVER_MEMORY_CPU``). ``max_read_bytes`` bounds one input read from a
    region (the transport's message limit: the HTTP body limit, or gRPC's through
    :meth:`bounded`), so a region is no way around it."""

    def __init__(self, max_read_bytes: int, max_regions: int = MAX_REGIONS):
        self.max_read_bytes = max_read_bytes
        self.max_regions = max_regions
        self._regions: dict[str, _Region] = {}

    def bounded(self, max_read_bytes: int) -> SystemSharedMemory:
        """The same regions, reads bounded by ``max_read_bytes`` (another transport's
        message limit: the gRPC adapter's view allows what a gRPC message may carry)."""
        view = SystemSharedMemory(max_read_bytes, self.max_regions)
        view._regions = self._regions
        return view

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes at ``offset`` of object ``key`` as region ``name``.

        Raises :class:`AlreadyExists` for a name in use, :class:`InvalidInput` for an object
        that does not open or is too small, or too many regions.
        """
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        if len(self._regions) >= self.max_regions:
            raise InvalidInput(
                f"failed to register shared memory region '{name}': "
                f"{self.max_regions} regions are registered already"
            )
        region = _Region(name, key, offset, byte_size, _open(name, key, offset, byte_size))
        region.closer = weakref.finalize(region, os.close, region.fd)
        self._regions[name] = region

    def busy(self, name: str = "") -> list[str]:
        """The regions among ``name`` (empty: all) that a request is using now."""
        names = [name] if name else list(self._regions)
        return [n for n in names if n in self._regions and self._regions[n].users]

    def unregister(self, name: str = "", busy_elsewhere: Collection[str] = ()) -> None:
        """Unmap region ``name`` (unknown: nothing happens, as in Triton), or every region
        when ``name`` is empty. A region a request is using stays, with InvalidInput, as does
        one in ``busy_elsewhere`` (in use in another gateway process: :mod:`gateway.siblings`)."""
        names = [name] if name else list(self._regions)
        held = set(self.busy(name)) | set(busy_elsewhere)
        busy = [n for n in names if n in self._regions and n in held]
        for each in names:
            region = self._regions.get(each)
            if region is not None and each not in held:
                del self._regions[each]
                region.close()
        if name and busy:
            raise InvalidInput(f"Cannot unregister shared memory region '{name}', it is currently in use.")
        if busy:
            raise InvalidInput(
                "Failed to unregister the following system shared memory regions: " + " ,".join(busy)
            )

    def status(self, name: str = "") -> list[dict[str, Any]]:
        """``[{name, key, offset, byte_size}]`` of region ``name``, or of all when empty;
        :class:`RegionNotFound` for an unknown name."""
        if not name:
            return [region.status() for region in self._regions.values()]
        if name not in self._regions:
            raise RegionNotFound(f"Unable to find system shared memory region: '{name}'")
        return [self._regions[name].status()]

    def _span(self, ref: SharedMemoryRef) -> tuple[_Region, int]:
        """The region of ``ref`` and the absolute start of its bytes in the mapping."""
        region = self._regions.get(ref.region)
        if region is None:
            raise RegionNotFound(f"Unable to find shared memory region: '{ref.region}'")
        if ref.offset >= region.byte_size:
            raise InvalidInput(f"Invalid offset for shared memory region: '{ref.region}'")
        if ref.offset + ref.byte_size > region.byte_size:
            raise InvalidInput(f"Invalid offset + byte size for shared memory region: '{ref.region}'")
        return region, region.offset + ref.offset

    def read(self, ref: SharedMemoryRef, tensor: str) -> bytes:
        """A copy of the bytes ``ref`` names (an input's data). Raises RegionNotFound,
        InvalidInput (bounds) or PayloadTooLarge (over ``max_read_bytes``)."""
        if ref.byte_size > self.max_read_bytes:
            raise PayloadTooLarge(
                f"input '{tensor}': {ref.byte_size} bytes of shared memory exceed the "
                f"server's limit of {self.max_read_bytes} bytes per request message"
            )
        region, start = self._span(ref)
        try:
            data = os.pread(region.descriptor(), ref.byte_size, start)
        except (ValueError, OSError):  # unregistered meanwhile (a large body is parsed off the loop)
            raise RegionNotFound(f"Unable to find shared memory region: '{ref.region}'") from None
        if len(data) != ref.byte_size:  # the client shrank the object since registering it
            raise _shrunk(ref.region)
        return data

    def check(self, ref: SharedMemoryRef) -> None:
        """Raise as :meth:`read` would when ``ref`` is not a valid span (an output's region
        is checked before the model runs, as Triton checks it when parsing the request)."""
        self._span(ref)

    def write(self, ref: SharedMemoryRef, data: bytes, tensor: str) -> None:
        """Copy an output's ``data`` into its region; InvalidInput when it does not fit."""
        region, start = self._span(ref)
        if len(data) > ref.byte_size:
            raise InvalidInput(
                f"shared memory size specified with the request for output '{tensor}' "
                f"({ref.byte_size} bytes) should be at least {len(data)} bytes to hold the results"
            )
        try:
            fd = region.descriptor()
            if os.fstat(fd).st_size < start + len(data):  # shrunk: never grow the client's object
                raise _shrunk(ref.region)
            os.pwrite(fd, data, start)
        except (ValueError, OSError):
            raise RegionNotFound(f"Unable to find shared memory region: '{ref.region}'") from None

    def hold(self, request: InferRequest) -> contextlib.AbstractContextManager[None]:
        """While the block runs, the regions of ``request``'s outputs are checked and cannot
        be unregistered (Triton's "currently in use"); nothing to hold for a request with no
        output in shared memory."""
        if not request.outputs:
            return _NOTHING_HELD
        refs = [o.shared_memory for o in request.outputs if o.shared_memory is not None]
        return self._holding(refs) if refs else _NOTHING_HELD

    @contextlib.contextmanager
    def _holding(self, refs: list[SharedMemoryRef]) -> Iterator[None]:
        for ref in refs:
            self.check(ref)
        regions = [self._regions[ref.region] for ref in refs]
        for region in regions:
            region.users += 1
        try:
            yield
        finally:
            for region in regions:
                region.users -= 1

    def write_outputs(self, request: InferRequest, response: InferResponse) -> None:
        """Write each output ``request`` asked into a region there (inside :meth:`hold`)."""
        if not request.outputs:
            return
        refs = {o.name: o.shared_memory for o in request.outputs if o.shared_memory is not None}
        for tensor in response.outputs:
            ref = refs.get(tensor.name)
            if ref is not None:
                self.write(ref, to_bytes(tensor.data, tensor.datatype), tensor.name)

    def close(self) -> None:
        """Close every region (the gateway is stopping)."""
        for region in self._regions.values():
            region.close()
        self._regions.clear()


_NOTHING_HELD = contextlib.nullcontext()
_NONE: frozenset[str] = frozenset()


def shared_memory_outputs(request: InferRequest) -> frozenset[str]:
    """Names of ``request``'s outputs that go to shared memory (rendered without data)."""
    if not request.outputs:
        return _NONE
    return frozenset(o.name for o in request.outputs if o.shared_memory is not None)


def unsupported_cuda() -> Unsupported:
    """The error every CUDA shared memory endpoint answers (HTTP 501, gRPC UNIMPLEMENTED)."""
    return Unsupported(CUDA_UNSUPPORTED)


def read_tensor(
    shm: SystemSharedMemory | None, ref: SharedMemoryRef, name: str, datatype: str, shape: list[int]
) -> np.ndarray:
    """Input ``name``'s array from the region ``ref`` names (both codecs call this).

    Raises RegionNotFound, InvalidInput (bounds, or a byte size that is not the shape's),
    PayloadTooLarge, or Unsupported where the caller has no region manager.
    """
    if shm is None:
        raise Unsupported(f"input '{name}': system shared memory is not available on this path")
    raw = shm.read(ref, name)
    if datatype != "BYTES":
        expected = element_count(shape) * numpy_dtype(datatype).itemsize
        if len(raw) != expected:  # Triton's wording (core infer_request.cc)
            raise InvalidInput(
                f"input byte size mismatch for input '{name}' in shared memory region "
                f"'{ref.region}'. Expected {expected}, got {len(raw)}"
            )
    try:
        return from_bytes(raw, datatype, shape)
    except InvalidInput as exc:
        raise InvalidInput(f"input '{name}' in shared memory region '{ref.region}': {exc.message}") from None
