"""An idle worker's decision to leave (workers/lifecycle.py: LEAVE_IF_OTHERS) in a real
redis-server: it leaves only when at least ``min_workers`` other workers are live (expired
heartbeats and its own not counted), in one Redis step, and one that stays is never off the
live count."""

from __future__ import annotations

import asyncio
import time

import pytest

from naiad import keys
from naiad.redis_client import connect
from workers.lifecycle import LEAVE_IF_OTHERS

MODEL = "leaving"


async def _decide(url: str, live_others: int, expired_others: int, own_live: bool, min_workers: int):
    redis = connect(url)
    try:
        key, now = keys.workers(MODEL), time.time()
        await redis.delete(key)
        beats = {f"live-{i}": now + 30 for i in range(live_others)}
        beats.update({f"gone-{i}": now - 1 for i in range(expired_others)})
        beats["me"] = now + 30 if own_live else now - 1
        await redis.zadd(key, beats)
        script = redis.register_script(LEAVE_IF_OTHERS)
        left = await script(keys=[key], args=[now, "me", min_workers])
        return bool(left), await redis.zscore(key, "me")
    finally:
        await redis.aclose()


@pytest.mark.parametrize("min_workers", [0, 1, 2])
@pytest.mark.parametrize("live_others", [0, 1, 2, 3])
@pytest.mark.parametrize("own_live", [True, False])
def test_the_script_leaves_exactly_when_enough_others_are_live(redis_url, min_workers, live_others, own_live):
    left, own = asyncio.run(_decide(redis_url, live_others, 2, own_live, min_workers))
    # two expired heartbeats beside it, and itself, never count as others
    assert left == (live_others >= min_workers)
    assert (own is None) == left  # gone when it left; untouched (still counted) when it stays
