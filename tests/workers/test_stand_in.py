"""workers.stand_in on a real redis-server: the heartbeat is beaten while the event loop is
stalled (as a Python model's long ``execute`` stalls a worker's loop), never after."""

from __future__ import annotations

import asyncio
import threading
import time

import redis

from naiad import keys, loop_stall
from workers.stand_in import THREAD_NAME, HeartbeatStandIn


def test_the_heartbeat_is_beaten_during_a_stall_and_not_after(redis_url):
    client = redis.Redis.from_url(redis_url)
    key = keys.workers("stalled")
    stand_in = HeartbeatStandIn(redis_url, "stalled", "w-1", 0.2, lambda: time.time() + 0.6)
    stand_in.start()
    seen: list[float | None] = []

    async def main() -> None:
        await asyncio.sleep(0.3)  # not stalled: the loop beats, the stand-in does not
        seen.append(client.zscore(key, "w-1"))
        with loop_stall.stalled():  # a model's call, three periods long
            started = time.time()
            while time.time() - started < 0.6:
                time.sleep(0.02)
                score = client.zscore(key, "w-1")
                if score is not None and not seen[1:]:
                    seen.append(time.time() - started)
        client.delete(key)
        await asyncio.sleep(0.4)  # after the stall: no beat
        seen.append(client.zscore(key, "w-1"))

    try:
        asyncio.run(main())
    finally:
        stand_in.stop()
    before, beaten_after_s, after = seen
    assert before is None and after is None
    assert 0.1 <= beaten_after_s < 0.45  # once the stall lasted half a period, within a period
    assert THREAD_NAME not in [t.name for t in threading.enumerate()]  # stop() ended it
