"""A worker's heartbeat while its event loop is stalled running its model.

A worker beats from its event loop (:meth:`workers.lifecycle.Lifecycle.heartbeat_loop`),
and a Python model's calls run on that loop's thread (:mod:`workers.model_thread`): an
``execute`` or ``initialize`` longer than two heartbeat periods would let the heartbeat's
deadline pass, and the requests it holds would be reclaimed as a dead worker's and run
twice. :class:`HeartbeatStandIn` is a thread that beats instead, with a synchronous client
of its own, once the stall under way (:mod:`naiad.loop_stall`) has lasted half a period, and
never after that stall ended (so not after the worker left: leaving runs on the loop).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis
from redis.exceptions import RedisError

from naiad import keys, loop_stall
from naiad.redis_client import connect_sync

logger = logging.getLogger(__name__)

#: The thread's name (``ps -L``, ``/proc/PID/task/TID/comm``).
THREAD_NAME = "naiad-heartbeat"


class HeartbeatStandIn:
    """Beats ``worker_id``'s heartbeat of ``model`` while the loop is stalled (module doc).
    ``deadline``: the heartbeat's score, as the loop's beat computes it (Unix seconds)."""

    def __init__(
        self, redis_url: str, model: str, worker_id: str, period_s: float, deadline: Callable[[], float]
    ) -> None:  # fmt: skip
        self.redis_url, self.key, self.worker_id = redis_url, keys.workers(model), worker_id
        self.period_s, self.deadline = period_s, deadline
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: redis.Redis | None = None

    def start(self) -> None:
        """Start the thread (it holds no connection until its first beat)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and close its connection (called on the loop, not in a stall)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def _run(self) -> None:
        half = self.period_s / 2
        while not self._stop.wait(half):
            loop_stall.while_stalled(half, self._beat)

    def _beat(self) -> None:
        try:
            if self._client is None:
                self._client = connect_sync(self.redis_url)
            self._client.zadd(self.key, {self.worker_id: self.deadline()})
        except RedisError as exc:  # the loop's own beat reports Redis's state; keep trying
            logger.debug("stand-in heartbeat failed: %s", exc)
