"""Redis clients with the timeouts Naiad relies on, made in one place.

Commands fail within ``COMMAND_TIMEOUT_S`` when Redis is gone (so the gateway answers 503
quickly instead of hanging); a client used for blocking reads (BLPOP, XREADGROUP BLOCK)
gets that much more than its longest block, or redis-py would time the read out itself.
"""

from __future__ import annotations

import redis.asyncio as aioredis

COMMAND_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 1.0


def connect(url: str, longest_block_s: float = 0.0) -> aioredis.Redis:
    """An asyncio client for ``url`` (``redis://``, ``rediss://`` or ``unix://``)."""
    return aioredis.from_url(
        url,
        socket_timeout=COMMAND_TIMEOUT_S + longest_block_s,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
    )
