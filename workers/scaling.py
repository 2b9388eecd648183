"""The scaler's policy per model, as pure functions: no Redis, no processes, no clock.

A model's :class:`ScalingPolicy` comes from the server-wide defaults (``--min-workers``,
``--max-workers``, ``--target-inflight``, ``--idle-timeout``; ``NAIAD_*`` variables) with
per-model overrides in the config's ``parameters``, which Triton itself ignores::

    parameters { key: "naiad.max_workers" value: { string_value: "3" } }

Keys (:data:`PARAMETERS`): ``naiad.min_workers`` (integer >= 0), ``naiad.max_workers``
(integer >= 1), ``naiad.target_inflight`` (integer >= 1), ``naiad.idle_timeout_s``
(seconds >= 0). An invalid value is ignored with a warning and the server default applies:
a mistyped knob never takes a model offline. ``min_workers`` above ``max_workers`` is
lowered to ``max_workers``.

A model's ``max_workers``, in order: its ``naiad.max_workers`` parameter; else, when its config
has an ``instance_group``, the number of instances the groups describe on this machine
(Triton's semantics: ``count`` per listed GPU, or per GPU, or on the CPU; see
:mod:`workers.placement`); else the server default (``--max-workers``).

:func:`decide` turns one reading of a model (its stream length, live and starting workers)
into how many workers to start or stop: up at once to ``ceil(demand / target_inflight)``
(clamped to ``[min_workers, max_workers]``), down by at most one per
``scale_down_period_s`` and never below ``max(min_workers, 1)`` — the last worker leaves on
its own idle timeout, which is what takes a model to zero.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from tritonclient.grpc import model_config_pb2 as mc

from naiad.settings import Settings

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class ScalingPolicy:
    """How many workers a model may run and when.

    ``min_workers``: kept up even when idle (0: scale to zero); ``max_workers``: never more;
    ``target_inflight``: requests (queued or running) one worker is meant to carry;
    ``idle_timeout_s``: seconds without requests after which a worker above the minimum exits.
    """

    min_workers: int = 0
    max_workers: int = 4
    target_inflight: int = 8
    idle_timeout_s: float = 60.0


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise ValueError(f"must be an integer >= {minimum}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError("must be a number of seconds >= 0")
    return value


#: ``parameters`` key -> (ScalingPolicy field, parser raising ValueError).
PARAMETERS: dict[str, tuple[str, Callable[[str], float]]] = {
    "naiad.min_workers": ("min_workers", _count(0)),
    "naiad.max_workers": ("max_workers", _count(1)),
    "naiad.target_inflight": ("target_inflight", _count(1)),
    "naiad.idle_timeout_s": ("idle_timeout_s", _seconds),
}


def default_policy(settings: Settings) -> ScalingPolicy:
    """The server-wide policy, from flags and ``NAIAD_*`` variables."""
    return _consistent(ScalingPolicy(
        min_workers=settings.min_workers,
        max_workers=settings.max_workers_per_model,
        target_inflight=settings.target_inflight,
        idle_timeout_s=settings.idle_timeout_s,
    ))  # fmt: skip


def parse_parameters(config: mc.ModelConfig | None) -> tuple[dict[str, float], list[str]]:
    """The scaling overrides of ``config`` (ScalingPolicy field -> value) and one message per
    invalid ``naiad.*`` scaling parameter, which is left out."""
    overrides: dict[str, float] = {}
    problems: list[str] = []
    if config is None:
        return overrides, problems
    for key, (field_name, parse) in PARAMETERS.items():
        if key not in config.parameters:
            continue
        text = config.parameters[key].string_value
        try:
            overrides[field_name] = parse(text)
        except ValueError as exc:
            problems.append(f"parameter {key}={text!r} ignored: {exc}")
    return overrides, problems


def policy_for(
    config: mc.ModelConfig | None, settings: Settings, instances: int | None = None
) -> ScalingPolicy:
    """The policy of the model whose config is ``config`` (None: an unavailable model, the
    server defaults); invalid parameters are logged and ignored. ``instances``: the model's
    instance count from its ``instance_group`` (:attr:`workers.placement.Slots.total`; None
    without groups), its ``max_workers`` unless ``naiad.max_workers`` is set."""
    overrides, problems = parse_parameters(config)
    for problem in problems:
        logger.warning("model '%s': %s", config.name if config is not None else "?", problem)
    base = default_policy(settings)
    if instances is not None:
        base = replace(base, max_workers=instances)
    return _consistent(replace(base, **overrides))


def _consistent(policy: ScalingPolicy) -> ScalingPolicy:
    max_workers = max(1, policy.max_workers)
    return replace(policy, max_workers=max_workers, min_workers=min(policy.min_workers, max_workers))


def desired_workers(policy: ScalingPolicy, demand: int) -> int:
    """Workers ``demand`` requests (queued + running) call for, within the policy's bounds."""
    wanted = math.ceil(max(demand, 0) / policy.target_inflight)
    return min(max(wanted, policy.min_workers), policy.max_workers)


@dataclass(frozen=True)
class ModelLoad:
    """One reading of a model. ``demand``: its stream length (requests queued or running:
    answered ones are deleted, so claimed-but-unanswered ones are in it); ``live``: workers
    with a current heartbeat, every machine; ``starting``: processes this scaler started
    that do not heartbeat yet."""

    demand: int
    live: int
    starting: int = 0

    @property
    def workers(self) -> int:
        return self.live + self.starting


@dataclass(frozen=True)
class Decision:
    """``start`` workers to start, ``stop`` workers to stop (at most one of them > 0)."""

    start: int = 0
    stop: int = 0


def decide(
    policy: ScalingPolicy, load: ModelLoad, seconds_since_change: float, scale_down_period_s: float
) -> Decision:
    """What to do about one model now. ``seconds_since_change``: since this scaler last
    started or stopped one of its workers (``inf`` when never).

    Up: every missing worker at once. Down: one worker, only when more run than wanted, more
    than ``max(min_workers, 1)`` run, and nothing changed for ``scale_down_period_s``.
    """
    wanted = desired_workers(policy, load.demand)
    if load.workers < wanted:
        return Decision(start=wanted - load.workers)
    floor = max(policy.min_workers, 1, wanted)
    if load.workers > floor and seconds_since_change >= scale_down_period_s:
        return Decision(stop=1)
    return Decision()


def to_stop(workers: Sequence[T], count: int) -> list[T]:
    """Which of ``workers`` (oldest first) to stop: the ``count`` most recently started."""
    return list(workers[len(workers) - count:]) if count > 0 else []

