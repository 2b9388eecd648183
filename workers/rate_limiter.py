"""Triton's rate limiter across the worker processes of one machine.

Semantics (Triton ``docs/user_guide/rate_limiter.md``, model_configuration.md "Rate Limiter
Configuration", core ``src/rate_limiter.cc``): with ``--rate-limit execution_count`` a worker
(one model instance) runs a batch only once every resource its instance group's
``rate_limiter`` lists is free in the asked number of copies; it holds them while the batch
runs. A resource is per device (the worker's GPU; CPU workers are device 0, as Triton's CPU
instances are) unless ``global: true``, then one pool for the machine. A resource has the
copies ``--rate-limit-resource NAME:COUNT[:DEVICE]`` gives it, else the most any instance
group of any model in the registry asks for. Waiting workers go in Triton's order: lowest
*scaled priority* first (batches run so far x ``priority``, 0 counting as 1: priority 2 gets
half the turns of priority 1), ties in arrival order, and only the head of the line may take
copies (a later waiter never overtakes it). A group without resources is not limited at all
(the documented meaning; no Redis call per batch). ``--rate-limit off`` ignores all of it.

Mechanism: the workers of a machine share one set of Redis keys tagged with the machine's
name (:mod:`naiad.keys`, ``rate_limit_*``), changed only by the Lua scripts below, so taking
or giving back several resources is one atomic step. Workers are separate processes, maybe
separate pods (``--rate-limit-host``: the node), so an in-process lock cannot do it, and file
locks or semaphores give neither several resources at once, nor priorities, nor a count
across pods. Holders and waiters keep a lease (:data:`LEASE_MS`) renewed five times per
lease; a worker killed while holding copies frees them when its lease passes. A
waiter blocks on its own wake list (BLPOP), which the script that grants it pushes to.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from tritonclient.grpc import model_config_pb2 as mc

from naiad import keys, tasks
from naiad.errors import ConfigError
from naiad.registry import RegistryReader
from naiad.settings import Settings, parse_rate_limit_resource

logger = logging.getLogger(__name__)

#: A holder's or waiter's lease, in ms; a worker that stops renewing loses its copies after it.
LEASE_MS = 5000
#: Renewals per lease: a holder renews (and a waiter looks again) every lease / this.
RENEWALS_PER_LEASE = 5
GLOBAL = "global"

_COMMON_LUA = """
local used, holders, leases, waiting, requests = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local wake_prefix, lease = ARGV[2], tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function free(worker)
  local held = redis.call('HGET', holders, worker)
  if held then
    for _, need in ipairs(cjson.decode(held)) do redis.call('HINCRBY', used, need[1], -need[2]) end
    redis.call('HDEL', holders, worker)
  end
end

local function forget(worker)
  local request = redis.call('HGET', requests, worker)
  if request then
    redis.call('ZREM', waiting, cjson.decode(request).member)
    redis.call('HDEL', requests, worker)
  end
end

for _, gone in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now)) do
  free(gone)
  forget(gone)
  redis.call('ZREM', leases, gone)
end

local function fits(needs)
  for _, need in ipairs(needs) do
    if tonumber(redis.call('HGET', used, need[1]) or '0') + need[2] > need[3] then return false end
  end
  return true
end

-- Triton's AttemptAllocation: only the head of the line may take copies.
local function grant()
  while true do
    local head = redis.call('ZRANGE', waiting, 0, 0)[1]
    if not head then return end
    local worker = string.sub(head, 22)
    local needs = cjson.decode(redis.call('HGET', requests, worker)).needs
    if not fits(needs) then return end
    for _, need in ipairs(needs) do redis.call('HINCRBY', used, need[1], need[2]) end
    redis.call('HSET', holders, worker, cjson.encode(needs))
    forget(worker)
    redis.call('ZADD', leases, now + lease, worker)
    redis.call('RPUSH', wake_prefix .. worker, '1')
    redis.call('PEXPIRE', wake_prefix .. worker, lease)
  end
end
"""

#: KEYS: used, holders, leases, waiting, requests, arrivals. ARGV: worker, wake prefix,
#: lease (ms), scaled priority, needs (JSON ``[[resource, count, capacity], ...]``).
#: 1: the worker holds its copies now; 0: it waits in line (lease renewed).
ACQUIRE_LUA = _COMMON_LUA + """
local worker = ARGV[1]
if redis.call('HEXISTS', holders, worker) == 0 and redis.call('HEXISTS', requests, worker) == 0 then
  local member = string.format('%020d', redis.call('INCR', KEYS[6])) .. ':' .. worker
  redis.call('ZADD', waiting, tonumber(ARGV[4]), member)
  redis.call('HSET', requests, worker, cjson.encode({member = member, needs = cjson.decode(ARGV[5])}))
end
redis.call('ZADD', leases, now + lease, worker)
grant()
if redis.call('HEXISTS', holders, worker) == 1 then
  redis.call('DEL', wake_prefix .. worker)
  return 1
end
return 0
"""

#: KEYS: as ACQUIRE (arrivals unused). ARGV: worker, wake prefix, lease (ms). Gives back the
#: worker's copies or its place in line, then grants the new head(s).
RELEASE_LUA = _COMMON_LUA + """
free(ARGV[1])
forget(ARGV[1])
redis.call('ZREM', leases, ARGV[1])
redis.call('DEL', wake_prefix .. ARGV[1])
grant()
return 1
"""

#: KEYS: leases. ARGV: worker, lease (ms). 1 while the worker still holds a lease.
RENEW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""


@dataclass(frozen=True)
class Need:
    """``count`` copies of ``resource`` (``<device>/<name>`` or ``global/<name>``) out of
    the machine's ``capacity``."""

    resource: str
    count: int
    capacity: int


# --- policy: pure functions ---------------------------------------------------------------


def device_id(device: str | None) -> int:
    """Triton's device of an instance: the GPU index of ``gpu:<i>``, 0 for the CPU."""
    if device and device.startswith("gpu:") and device[4:].isdigit():
        return int(device[4:])
    return 0


def instance_group(config: mc.ModelConfig, device: str | None) -> mc.ModelInstanceGroup | None:
    """The instance group a worker on ``device`` belongs to: on a GPU the first GPU (or
    AUTO) group that lists it or lists none, on the CPU the first CPU group, else the first."""
    groups = list(config.instance_group)
    on_gpu = bool(device and device.startswith("gpu:"))
    for group in groups:
        if on_gpu and group.kind in (mc.ModelInstanceGroup.KIND_GPU, mc.ModelInstanceGroup.KIND_AUTO):
            if not group.gpus or device_id(device) in group.gpus:
                return group
        if not on_gpu and group.kind == mc.ModelInstanceGroup.KIND_CPU:
            return group
    return groups[0] if groups else None


def _resource(resource: mc.ModelRateLimiter.Resource, device: int) -> str:
    return f"{GLOBAL}/{resource.name}" if getattr(resource, "global") else f"{device}/{resource.name}"


def _group_devices(group: mc.ModelInstanceGroup) -> set[int] | None:
    """Devices a group's instances may be on (None: any GPU)."""
    if group.kind == mc.ModelInstanceGroup.KIND_CPU:
        return {0}
    return set(group.gpus) or None


def _default(name: str, is_global: bool, device: int, configs: Iterable[mc.ModelConfig]) -> int:
    """The most copies of ``name`` any instance group of ``configs`` asks for on ``device``."""
    most = 0
    for config in configs:
        for group in config.instance_group:
            devices = _group_devices(group)
            if not is_global and devices is not None and device not in devices:
                continue
            for resource in group.rate_limiter.resources:
                if resource.name == name and getattr(resource, "global") == is_global:
                    most = max(most, resource.count)
    return most


def _explicit(name: str, is_global: bool, device: int, flags: Sequence[str]) -> int | None:
    """Copies ``--rate-limit-resource`` gives ``name`` (Triton: a global resource takes the
    largest value given for it; a device one the largest of its device's and the all-device
    values); None when no flag names it."""
    counts = [
        count for flag_name, count, flag_device in map(parse_rate_limit_resource, flags)
        if flag_name == name and (is_global or flag_device is None or flag_device == device)
    ]  # fmt: skip
    return max(counts) if counts else None


def _check_kinds(configs: Iterable[mc.ModelConfig]) -> None:
    kinds: dict[str, bool] = {}
    for config in configs:
        for group in config.instance_group:
            for resource in group.rate_limiter.resources:
                is_global = getattr(resource, "global")
                if kinds.setdefault(resource.name, is_global) != is_global:
                    raise ConfigError(
                        f'Resource "{resource.name}" is present as both global and device-specific '
                        "resource in the model configuration."
                    )


def needs(
    config: mc.ModelConfig, device: str | None, configs: Iterable[mc.ModelConfig], flags: Sequence[str]
) -> tuple[list[Need], int]:
    """What a worker of ``config`` on ``device`` needs per batch, with each resource's
    capacity, and its priority (at least 1); ``configs``: every model's config (the
    defaults), ``flags``: the ``--rate-limit-resource`` values. Raises ConfigError, with
    Triton's words, when a count given is below what the group needs or a resource is both
    global and per device."""
    group = instance_group(config, device)
    if group is None or not group.HasField("rate_limiter"):
        return [], 1
    configs = [config, *configs]
    _check_kinds(configs)
    dev, found = device_id(device), []
    for resource in group.rate_limiter.resources:
        is_global = getattr(resource, "global")
        explicit = _explicit(resource.name, is_global, dev, flags)
        capacity = _default(resource.name, is_global, dev, configs) if explicit is None else explicit
        if capacity < resource.count:
            raise ConfigError(
                f'Resource count for "{resource.name}" is limited to {capacity} which will prevent '
                "scheduling of one or more model instances, the minimum required count is "
                f"{resource.count}"
            )
        if resource.count:
            found.append(Need(_resource(resource, dev), resource.count, capacity))
    return found, max(group.rate_limiter.priority, 1)


# --- the shared limiter ---------------------------------------------------------------------


class RateLimiter:
    """One worker's side of its machine's rate limiter: :meth:`slot` around each batch."""

    def __init__(
        self, redis: Redis, host: str, worker_id: str, wanted: list[Need], priority: int,
        lease_ms: int = LEASE_MS,
    ):  # fmt: skip
        self.redis, self.host, self.worker_id = redis, host, worker_id
        self.priority, self.lease_ms = priority, lease_ms
        self.renew_s = lease_ms / 1000 / RENEWALS_PER_LEASE
        self.executions = 0  # batches run so far: Triton's exec_count
        self._needs = json.dumps([[n.resource, n.count, n.capacity] for n in wanted])
        self._keys = [keys.rate_limit_used(host), keys.rate_limit_holders(host), keys.rate_limit_leases(host),
                      keys.rate_limit_waiting(host), keys.rate_limit_requests(host),
                      keys.rate_limit_arrivals(host)]  # fmt: skip
        self._wake_prefix = keys.rate_limit_wake(host, "")
        self._acquire = redis.register_script(ACQUIRE_LUA)
        self._release = redis.register_script(RELEASE_LUA)
        self._renew = redis.register_script(RENEW_LUA)

    async def acquire(self) -> None:
        """Wait in line until this worker holds its copies (renewing its place meanwhile)."""
        score = self.executions * self.priority
        args = [self.worker_id, self._wake_prefix, self.lease_ms, score, self._needs]
        while not await self._acquire(keys=self._keys, args=args):
            await self.redis.blpop([self._wake_prefix + self.worker_id], timeout=self.renew_s)

    async def release(self) -> None:
        """Give the copies (or the place in line) back and let the next in line have them."""
        await self._release(keys=self._keys[:5], args=[self.worker_id, self._wake_prefix, self.lease_ms])

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self.renew_s)
            if not await self._renew(keys=[self._keys[2]], args=[self.worker_id, self.lease_ms]):
                logger.warning("rate limiter lease of worker %s lapsed while it ran a batch", self.worker_id)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """The block runs holding this worker's resources (waiting for them first)."""
        try:
            await self.acquire()
            keeper = asyncio.create_task(self._keep())
            try:
                yield
            finally:
                await tasks.cancel_and_wait(keeper)  # a plain cancel may be lost (naiad.tasks)
        finally:
            self.executions += 1
            await asyncio.shield(self.release())


def slot(limiter: RateLimiter | None) -> contextlib.AbstractAsyncContextManager[None]:
    """``limiter.slot()``, or nothing to wait for when the worker is not rate limited (a
    plain ``nullcontext``: no generator per batch)."""
    return _UNLIMITED if limiter is None else limiter.slot()


_UNLIMITED: contextlib.AbstractAsyncContextManager[None] = contextlib.nullcontext()


def may_limit(settings: Settings, config: mc.ModelConfig) -> bool:
    """Whether a worker of ``config`` may be rate limited: the limiter is on and its instance
    group lists resources (:func:`for_worker` then reads what the other models need)."""
    if settings.rate_limit == "off":
        return False
    group = instance_group(config, settings.device)
    return group is not None and bool(group.rate_limiter.resources)


async def for_worker(
    settings: Settings, redis: Redis, worker_id: str, config: mc.ModelConfig
) -> RateLimiter | None:
    """The limiter of a worker of ``config`` (None: ``--rate-limit off``, or its instance
    group lists no resources). Reads every model's config from the registry once, for the
    default copies. Raises ConfigError (see :func:`needs`): the model cannot be scheduled."""
    if not may_limit(settings, config):
        return None
    entries = await RegistryReader(redis).read_all()
    configs = [e.config for e in entries.values() if e.config is not None]
    wanted, priority = needs(config, settings.device, configs, settings.rate_limit_resource)
    if not wanted:
        return None
    host = settings.rate_limit_host or socket.gethostname()
    logger.info("rate limited on %s: %s, priority %d", host,
                ", ".join(f"{n.resource} x{n.count} of {n.capacity}" for n in wanted), priority)  # fmt: skip
    return RateLimiter(redis, host, worker_id, wanted, priority)
