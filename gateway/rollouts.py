"""Traffic between versions at the gateway: routing by split, shadow copies, rollbacks.

The rules are :mod:`naiad.rollout`'s (pure functions); this module applies them to the
registry's entries and keeps what a gateway needs between requests:

- the parsed :class:`RolloutPolicy` of each entry (parsed once per registry entry; invalid
  ``naiad.*`` values are logged once and ignored);
- per version of a split with ``naiad.rollback_error_rate``, the outcomes of the last
  ``rollback_min_requests`` requests *this gateway* carried (memory bounded by that
  window). When the failure ratio passes the rate, the gateway records the decision in
  Redis (:data:`naiad.keys.ROLLBACKS`, one script: the first gateway's decision stands) and
  bumps the registry generation, so every gateway routes around the version within its sync
  interval, and a gateway that starts later reads it with the registry. The decision counts
  once in ``naiad_rollbacks_total{model,version}`` and is logged; it holds until the model's
  config changes.

Each gateway judges from the requests it carried: with N gateways a version fails over
about ``rollback_min_requests`` requests of one of them, not of all together.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.registry import ModelRegistry
from naiad import keys, rollout
from naiad.errors import ModelNotReady, NaiadError, Overloaded, QueueTimeout
from naiad.registry import ModelEntry
from naiad.rollout import RolloutPolicy

logger = logging.getLogger(__name__)

#: KEYS: the rollbacks hash, the model's lifecycle hash, the registry generation. ARGV: the
#: field, the value (digest first), the lifecycle counter. Writes unless a decision under the
#: same config is there (one gateway's decision counts), then counts it and bumps the generation.
DECIDE_LUA = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current and string.sub(current, 1, 64) == string.sub(ARGV[2], 1, 64) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
redis.call('INCR', KEYS[3])
return 1
"""


def counts_against_version(exc: BaseException) -> bool:
    """Whether a failed request says something about the version that ran it: a server-side
    error (5xx: the model failed, timed out) or the version not loading; not a client's error,
    a cancelled request (the client left), or a full gateway or queue (capacity, not the
    version)."""
    if isinstance(exc, (asyncio.CancelledError, Overloaded, QueueTimeout)):
        return False
    if isinstance(exc, NaiadError):
        return isinstance(exc, ModelNotReady) or exc.status >= 500
    return True


class Rollouts:
    """One gateway's view of every model's traffic rules (see the module doc)."""

    def __init__(self, redis: aioredis.Redis, registry: ModelRegistry):
        self.redis = redis
        self.registry = registry
        self._policies: dict[str, tuple[ModelEntry, RolloutPolicy]] = {}
        self._windows: dict[tuple[str, int], tuple[ModelEntry, deque[bool]]] = {}
        self._deciding: set[tuple[str, int]] = set()
        self._tasks: set[asyncio.Task] = set()

    def policy(self, entry: ModelEntry) -> RolloutPolicy:
        """``entry``'s rules, parsed once per registry entry (problems logged then)."""
        cached = self._policies.get(entry.name)
        if cached is not None and cached[0] is entry:
            return cached[1]
        policy, problems = rollout.policy_of(entry.config, entry.versions)
        for problem in problems:
            logger.warning("model '%s': %s", entry.name, problem)
        self._policies[entry.name] = (entry, policy)
        return policy

    def split(self, entry: ModelEntry) -> rollout.Split:
        """The split in force: the config's, less the versions rolled back."""
        split = self.policy(entry).split
        rolled_back = self.registry.rolled_back(entry.name)
        return rollout.without(split, set(rolled_back)) if rolled_back else split

    def route(self, entry: ModelEntry, route_key: str | None) -> int:
        """The version a request to ``entry`` that names none gets."""
        if not self.policy(entry).split:  # most models: no split, nothing rolled back to look up
            return max(entry.versions)
        split = self.split(entry)
        return rollout.pick_version(split, entry.name, route_key) if split else max(entry.versions)

    def shadow(self, entry: ModelEntry, version: int) -> int | None:
        """The version a copy of a request answered by ``version`` also goes to, or None."""
        policy = self.policy(entry)
        return None if policy.shadow is None else rollout.shadow_copy(policy, version)

    def observe(self, entry: ModelEntry, version: int, error: BaseException | None) -> None:
        """Count one outcome of ``version`` (``error`` None: a success) and roll the version
        back when its failure ratio passes the model's rate."""
        policy = self.policy(entry)
        if policy.rollback_error_rate is None or version not in dict(policy.split):
            return
        if error is not None and not counts_against_version(error):
            return
        key = (entry.name, version)
        window = self._windows.get(key)
        if window is None or window[0] is not entry:  # a new entry (config or versions): start over
            window = self._windows[key] = (entry, deque(maxlen=policy.rollback_min_requests))
        window[1].append(error is None)
        ratio = rollout.failure_ratio_passed(window[1], policy)
        if ratio is None or key in self._deciding or version in self.registry.rolled_back(entry.name):
            return
        if not rollout.without(self.split(entry), {version}):
            return  # the last version of the split left: nowhere to send its traffic
        self._deciding.add(key)
        task = asyncio.get_running_loop().create_task(self._roll_back(entry, version, ratio, len(window[1])))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _roll_back(self, entry: ModelEntry, version: int, ratio: float, requests: int) -> None:
        policy = self.policy(entry)
        reason = (f"rolled back automatically: failure ratio {ratio:.3f} over its last {requests} "
                  f"requests passed naiad.rollback_error_rate {policy.rollback_error_rate:g}")  # fmt: skip
        field = rollout.rollback_field(entry.name, version)
        try:
            decided = await self.redis.eval(
                DECIDE_LUA, 3, keys.ROLLBACKS, keys.lifecycle(entry.name), keys.REGISTRY_GENERATION,
                field, rollout.rollback_value(entry.config, reason), f"rollbacks:{version}",
            )  # fmt: skip
            if decided:
                logger.warning("model '%s' version %d %s", entry.name, version, reason)
            self.registry.expire()
        except RedisError as exc:
            logger.warning("rollback of model '%s' version %d not recorded: %s", entry.name, version, exc)
        finally:
            self._deciding.discard((entry.name, version))

    async def close(self) -> None:
        """Wait for the decisions being written."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
