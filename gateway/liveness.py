"""Server liveness: not live while Redis has been unreachable longer than a grace period.

KServe v2's ``/v2/health/live`` (gRPC ``ServerLive``) tells an orchestrator whether to
restart the server. A gateway is stateless, so the one fault a restart can cure is a Redis
that stays gone (for ``naiad serve``, its embedded one that could not come back): after
``grace_s`` seconds without one successful ``PING`` the gateway says not live. A short Redis
restart (the embedded one is back within a second) never makes it not live.
"""

from __future__ import annotations

import asyncio
import logging
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

#: Seconds between pings.
PING_INTERVAL_S = 1.0


class RedisLiveness:
    """Pings ``redis`` every :data:`PING_INTERVAL_S` in :meth:`run` (a background task);
    :meth:`live` is False once the last successful ping is ``grace_s`` seconds old."""

    def __init__(self, redis: aioredis.Redis, grace_s: float):
        self.redis = redis
        self.grace_s = grace_s
        self.last_ok = time.monotonic()
        self._down_logged = False

    def live(self) -> bool:
        return self.down_for_s() < self.grace_s

    def down_for_s(self) -> float:
        """Seconds since the last successful ping (0 right after one)."""
        return max(0.0, time.monotonic() - self.last_ok - PING_INTERVAL_S)

    async def run(self) -> None:
        """Ping until cancelled. redis-py may swallow a cancellation that lands in a
        command, so the loop also ends when its task is being cancelled."""
        task = asyncio.current_task()
        while task is None or not task.cancelling():
            try:
                await self.redis.ping()
                if self._down_logged:
                    logger.warning("redis is reachable again after %.1f s", self.down_for_s())
                self.last_ok, self._down_logged = time.monotonic(), False
            except (RedisError, OSError) as exc:
                if not self.live() and not self._down_logged:
                    logger.error("redis unreachable for %.0f s (%s): the server reports not live",
                                 self.down_for_s(), exc)
                    self._down_logged = True
            await asyncio.sleep(PING_INTERVAL_S)
