"""BYTES tensors whose elements are not ``bytes``, and what Triton sends for them: an element
of type exactly ``bytes`` as it is, anything else ``str(element)`` in UTF-8 (python_backend's
``serialize_byte_tensor``; :func:`naiad.datatypes.bytes_elements`), and a byte-string (``S``)
array, taken as it is. Shared by the tests of every path that sends BYTES."""

from __future__ import annotations

import numpy as np


def objects(*items: object) -> np.ndarray:
    """An object array of ``items``, one by one (a list stays one element)."""
    array = np.empty(len(items), dtype=np.object_)
    for i, item in enumerate(items):
        array[i] = item
    return array


MIXED = objects(1, 1.5, None, [1, 2], np.bytes_(b"a"), "é", b"b\0", np.str_("x"))
MIXED_BYTES = [b"1", b"1.5", b"None", b"[1, 2]", b"b'a'", b"\xc3\xa9", b"b\0", b"x"]
STRINGS = np.array([b"x", b"yz"], dtype="S2")
