"""Requests in flight in all of a server's gateway processes, read by any of them.

A gateway process counts the inference requests it carries (:meth:`gateway.dataplane.DataPlane.admit`);
with ``--gateway-processes N > 1`` (:mod:`gateway.siblings`) some decisions need the server's
count: a gateway polls for the answer to its only request (:mod:`naiad.busy_poll`) only while
the *server* carries that one request (two processes each polling for one of two requests
cost their worker the CPU it needed: docs/benchmarks.md, "Stop 42"). Each process writes its
own count into a slot of one file in the server's private folder, mapped shared by every
process (``mmap``, ``MAP_SHARED``: a store is seen by the others without a system call); a
process claims its slot by creating ``inflight-<slot>`` there exclusively (``O_EXCL``). A
slot holds one aligned 64-bit integer, written by one process alone: a reader sees the old
count or the new one. A process killed while it carried requests leaves its count behind
(its siblings are not restarted): the server then never counts as carrying one request
alone, which only turns polling off.
"""

from __future__ import annotations

import mmap
import os
import pathlib

#: Slots in the file: gateway processes a server may have (``--gateway-processes``).
SLOTS = 64
FILE = "inflight"


class SharedInflight:
    """This process's slot of the server's in-flight counts (module doc)."""

    def __init__(self, folder: pathlib.Path) -> None:
        """Map ``folder``'s count file (made, zeroed, by the first process to open it) and
        claim a free slot; raises ``OSError`` when none is free or the folder is unusable."""
        self.slot = _claim(folder)  # first: a failed claim leaves nothing mapped
        fd = os.open(folder / FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < SLOTS * 8:
                os.ftruncate(fd, SLOTS * 8)  # zeros: no process carries anything yet
            self._map = mmap.mmap(fd, SLOTS * 8)
        finally:
            os.close(fd)
        self._counts = memoryview(self._map).cast("q")
        self._counts[self.slot] = 0

    def set(self, count: int) -> None:
        """This process carries ``count`` requests now."""
        self._counts[self.slot] = count

    def total(self) -> int:
        """Requests the server's gateway processes carry, as last written by each."""
        return sum(self._counts)

    def close(self) -> None:
        self._counts[self.slot] = 0
        self._counts.release()
        self._map.close()


def _claim(folder: pathlib.Path) -> int:
    for slot in range(SLOTS):
        try:
            os.close(os.open(folder / f"{FILE}-{slot}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            continue
        return slot
    raise OSError(f"no free slot of {SLOTS} in {folder / FILE}")
