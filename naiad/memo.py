"""Bounded memos of what requests repeat (a head's bytes, a binary header, a tensor spec, a
request's shape that passed validation): work done once, then a lookup.

:func:`remember` stores into a plain dict and empties it first when it holds ``most``
entries: a bound on memory, not an LRU (the repeating keys come back at once). The entry
is stored apart from the lookup: after a check that may raise, or only for some results
(a head handed to aiohttp, a request with JSON data, is not remembered)."""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def remember(table: dict[K, V], key: K, value: V, most: int) -> V:
    """``table[key] = value`` (``table`` emptied first when it holds ``most``); ``value``."""
    if len(table) >= most:
        table.clear()
    table[key] = value
    return value
