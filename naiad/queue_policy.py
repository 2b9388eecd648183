"""Triton's dynamic-batcher queue: priority levels and the queue policy of each level.

Sources: Triton docs/user_guide/batcher.md ("Priority Levels", "Queue Policy"),
model_config.proto (``ModelDynamicBatching``, ``ModelQueuePolicy``) and the rules of
triton-inference-server/core it cites below. Shared by the gateway (which stream a request
joins, its bound, its queue timeout) and the workers (the order they serve what they read).

- **Levels**: with ``dynamic_batching { priority_levels: N }`` (N > 0) level 1 is served
  first, N last; requests of one level in arrival order. A request's ``priority`` 0, or one
  above N, is the model's ``default_priority_level`` (core ``InferenceRequest::SetPriority``
  clamps it; Triton does not refuse it). Without ``dynamic_batching`` or with N = 0 there is
  one queue, level 0. Each level is its own Redis stream (:func:`naiad.keys.request_stream`).
- **Policy**: a level's ``priority_queue_policy`` entry, else ``default_queue_policy``.
- **Queue timeout** (core ``PriorityQueue::PolicyQueue::Enqueue``): the policy's
  ``default_timeout_microseconds`` (0: none); with ``allow_timeout_override`` the request's
  ``timeout`` parameter (µs) replaces it when non-zero and smaller: it may shorten the
  timeout, never lengthen it, and a policy without a default timeout keeps none.
- **Timeout action**: REJECT answers :class:`naiad.errors.QueueTimeout` once the request has
  waited longer; DELAY keeps it, served after the requests of its level (and higher levels)
  whose timeout has not passed.
- **max_queue_size**: per level; 0 means the server's ``--max-queue-size``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from tritonclient.grpc import model_config_pb2 as mc

from naiad import keys
from naiad.errors import ConfigError

#: Most priority levels a model may have: one Redis stream each, all read by every worker.
MAX_PRIORITY_LEVELS = 16

DELAY = mc.ModelQueuePolicy.DELAY


def priority_levels(config: mc.ModelConfig) -> int:
    """The model's priority levels, 0 when it has a single queue."""
    return config.dynamic_batching.priority_levels if config.HasField("dynamic_batching") else 0


def level_of(config: mc.ModelConfig, priority: Any) -> int:
    """The level a request with ``priority`` (its parameter; None or non-integers count as
    0) waits at: 0 for a single queue, else 1..priority_levels."""
    return _table(config).level(priority)


def streams(model: str, config: mc.ModelConfig) -> list[str]:
    """Every request stream of ``model``, highest priority first."""
    return keys.request_streams(model, priority_levels(config))


def queue_timeout_us(policy: mc.ModelQueuePolicy, requested_us: Any) -> int:
    """Microseconds a request may wait in the queue (0: no limit): Triton's rule, see the
    module doc. ``requested_us``: the request's ``timeout`` parameter (None: not given)."""
    return _LevelPolicy.of(policy).timeout_us(requested_us)


def queue_timeout(config: mc.ModelConfig, level: int, parameters: Mapping[str, Any]) -> tuple[float, bool]:
    """``(seconds, reject)``: how long a request at ``level`` with ``parameters`` may wait in
    the queue (0: no limit), and whether its timeout action is REJECT (else DELAY)."""
    policy = _table(config).policy(level)
    return policy.timeout_us(parameters.get("timeout")) / 1e6, policy.reject


class _LevelPolicy(NamedTuple):
    """The fields of one level's ``ModelQueuePolicy`` that requests read, as Python values."""

    max_queue_size: int
    default_timeout_us: int
    allow_override: bool
    reject: bool

    @classmethod
    def of(cls, policy: mc.ModelQueuePolicy) -> _LevelPolicy:
        return cls(policy.max_queue_size, policy.default_timeout_microseconds,
                   policy.allow_timeout_override, policy.timeout_action != DELAY)  # fmt: skip

    def timeout_us(self, requested_us: Any) -> int:
        """The queue timeout of a request asking ``requested_us`` (module doc)."""
        timeout_us = self.default_timeout_us
        if self.allow_override and type(requested_us) is int and 0 < requested_us < timeout_us:
            timeout_us = requested_us
        return timeout_us


@dataclass(frozen=True)
class _Table:
    """What requests read of one config, read out once (protobuf field access would cost a
    request ~7 µs in :func:`place`): the levels, the default level, each level's policy (its
    ``priority_queue_policy`` entry, else ``default_queue_policy``), ``preserve_ordering``
    and the batch (``max_batch_size``, at least 1)."""

    levels: int
    default_level: int
    policies: dict[int, _LevelPolicy]
    default_policy: _LevelPolicy
    ordered: bool
    batch: int

    def policy(self, level: int) -> _LevelPolicy:
        return self.policies.get(level, self.default_policy)

    def level(self, priority: Any) -> int:
        if self.levels == 0:
            return 0
        if type(priority) is not int or not 1 <= priority <= self.levels:
            return self.default_level
        return priority


def _table(config: mc.ModelConfig) -> _Table:
    """The table of ``config``, cached by its serialized bytes (a config changed in place
    gets a new one)."""
    return _table_of(config.SerializeToString())


@functools.lru_cache(maxsize=1024)
def _table_of(serialized: bytes) -> _Table:
    config = mc.ModelConfig.FromString(serialized)
    batching = config.dynamic_batching
    policies = {level: _LevelPolicy.of(policy) for level, policy in batching.priority_queue_policy.items()}
    default = _LevelPolicy.of(batching.default_queue_policy)
    return _Table(priority_levels(config), batching.default_priority_level, policies, default,
                  batching.preserve_ordering, max(config.max_batch_size, 1))  # fmt: skip


class Placement(NamedTuple):
    """Where and how one request waits: its ``level`` and ``stream``, the level's
    ``max_queue`` (entries, 0: no bound), ``timeout_s`` (seconds it may wait in the queue, 0:
    no limit), ``reject`` (the timeout action is REJECT, not DELAY), ``ordered`` (the
    model's ``preserve_ordering``) and ``batch`` (requests one worker executes at once at
    most: ``max_batch_size``, 1 when the model does not batch; what ``max_queue`` does not
    count of the claimed entries, see :data:`naiad.queue_client.BOUNDED_XADD`)."""

    level: int
    stream: str
    max_queue: int
    timeout_s: float
    reject: bool
    ordered: bool
    batch: int = 1


def place(
    model: str, config: mc.ModelConfig, parameters: Mapping[str, Any], server_max_queue: int = 0
) -> Placement:
    """The :class:`Placement` of a request to ``model`` with ``parameters`` (its
    ``priority`` and ``timeout``); ``server_max_queue``: the bound of a level whose policy
    sets none."""
    table = _table(config)
    level = table.level(parameters.get("priority"))
    policy = table.policy(level)
    return Placement(
        level, keys.request_stream(model, level), policy.max_queue_size or server_max_queue,
        policy.timeout_us(parameters.get("timeout")) / 1e6, policy.reject, table.ordered, table.batch,
    )  # fmt: skip


def check_config(config: mc.ModelConfig) -> None:
    """Triton's checks of ``dynamic_batching`` (core ``model_config_utils.cc``
    ``ValidateModelConfig``), plus Naiad's bound on levels. Raises :class:`ConfigError` for:
    a ``preferred_batch_size`` not in 1..max_batch_size; a ``default_priority_level`` or
    ``priority_queue_policy`` level outside 1..priority_levels; ``preserve_ordering`` with
    more than one level or with a DELAY policy that has a timeout; more than
    :data:`MAX_PRIORITY_LEVELS` levels."""
    if not config.HasField("dynamic_batching"):
        return
    batching, name = config.dynamic_batching, config.name
    for size in batching.preferred_batch_size:
        if not 0 < size <= config.max_batch_size:
            raise ConfigError(f"dynamic batching preferred size {size} must be in 1..max_batch_size "
                              f"({config.max_batch_size}) for {name}")  # fmt: skip
    levels = batching.priority_levels
    if levels > MAX_PRIORITY_LEVELS:
        raise ConfigError(f"priority_levels {levels} of {name}: Naiad supports at most {MAX_PRIORITY_LEVELS}")
    if levels and not 1 <= batching.default_priority_level <= levels:
        raise ConfigError(f"default priority level must be in range [1, {levels}] for {name}")
    if any(not 1 <= level <= levels for level in batching.priority_queue_policy):
        raise ConfigError(f"priority queue policy must have priority level in range [1, {levels}] for {name}")
    if batching.preserve_ordering:
        if levels > 1:
            raise ConfigError(f"Only one priority level is allowed when 'preserve_ordering' is true "
                              f"for {name}")  # fmt: skip
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        if any(p.default_timeout_microseconds and p.timeout_action == DELAY for p in policies):
            raise ConfigError("Queue policy can not have DELAY as timeout action when "
                              f"'preserve_ordering' is true for {name}")  # fmt: skip
