"""The scaler's policy (workers/scaling.py): pure functions, no servers."""

from __future__ import annotations

import logging
import math

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from naiad.settings import Settings
from workers import scaling
from workers.scaling import Decision, ModelLoad, ScalingPolicy

POLICY = ScalingPolicy(min_workers=0, max_workers=3, target_inflight=2, idle_timeout_s=5)
NEVER = math.inf  # seconds since the last change when there was none
PERIOD = 10.0


def config(**parameters: str) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name="m")
    for key, value in parameters.items():
        cfg.parameters[key.replace("__", ".")].string_value = value
    return cfg


def test_defaults_come_from_settings():
    settings = Settings(min_workers=1, max_workers_per_model=5, target_inflight=3, idle_timeout_s=7)
    assert scaling.policy_for(None, settings) == ScalingPolicy(1, 5, 3, 7.0)
    assert scaling.policy_for(config(), settings) == ScalingPolicy(1, 5, 3, 7.0)
    assert Settings().max_workers_per_model == 4 and Settings().target_inflight == 8
    assert Settings().min_workers == 0


def test_config_parameters_override_the_defaults():
    cfg = config(naiad__min_workers="1", naiad__max_workers="3", naiad__target_inflight="2",
                 naiad__idle_timeout_s="0.5", other__key="kept for others")
    assert scaling.policy_for(cfg, Settings()) == ScalingPolicy(1, 3, 2, 0.5)


@pytest.mark.parametrize(
    ("key", "value"),
    [("naiad.max_workers", "0"), ("naiad.max_workers", "three"), ("naiad.min_workers", "-1"),
     ("naiad.target_inflight", "1.5"), ("naiad.idle_timeout_s", "nan"), ("naiad.idle_timeout_s", "-2"),
     ("naiad.max_workers", "")],
)
def test_invalid_parameters_fall_back_with_a_warning(key, value, caplog):
    cfg = mc.ModelConfig(name="m")
    cfg.parameters[key].string_value = value
    with caplog.at_level(logging.WARNING, logger="workers.scaling"):
        assert scaling.policy_for(cfg, Settings()) == scaling.default_policy(Settings())
    assert f"model 'm': parameter {key}={value!r} ignored: must be" in caplog.text
    _, problems = scaling.parse_parameters(cfg)
    assert len(problems) == 1


def test_min_above_max_is_lowered():
    policy = scaling.policy_for(config(naiad__min_workers="5", naiad__max_workers="2"), Settings())
    assert (policy.min_workers, policy.max_workers) == (2, 2)


@pytest.mark.parametrize(
    ("demand", "wanted"), [(0, 0), (1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (100, 3)]
)
def test_desired_workers_is_ceil_of_demand_over_target_clamped(demand, wanted):
    assert scaling.desired_workers(POLICY, demand) == wanted


def test_desired_workers_never_below_min():
    policy = ScalingPolicy(min_workers=2, max_workers=3, target_inflight=2)
    assert scaling.desired_workers(policy, 0) == 2


def test_scale_up_starts_every_missing_worker_in_one_decision():
    assert scaling.decide(POLICY, ModelLoad(demand=10, live=0), NEVER, PERIOD) == Decision(start=3)
    assert scaling.decide(POLICY, ModelLoad(demand=10, live=1), 0.0, PERIOD) == Decision(start=2)


def test_starting_workers_count_so_a_second_tick_does_not_overshoot():
    assert scaling.decide(POLICY, ModelLoad(demand=10, live=0, starting=3), 0.0, PERIOD) == Decision()
    assert scaling.decide(POLICY, ModelLoad(demand=10, live=1, starting=1), 0.0, PERIOD) == Decision(start=1)


def test_scale_up_ignores_the_scale_down_period():
    assert scaling.decide(POLICY, ModelLoad(demand=3, live=1), 0.0, PERIOD) == Decision(start=1)


def test_scale_down_is_one_worker_per_period():
    idle = ModelLoad(demand=0, live=3)
    assert scaling.decide(POLICY, idle, PERIOD - 0.1, PERIOD) == Decision()
    assert scaling.decide(POLICY, idle, PERIOD, PERIOD) == Decision(stop=1)
    assert scaling.decide(POLICY, ModelLoad(demand=0, live=2), PERIOD, PERIOD) == Decision(stop=1)


def test_scale_down_leaves_the_last_worker_to_its_idle_timeout():
    assert scaling.decide(POLICY, ModelLoad(demand=0, live=1), NEVER, PERIOD) == Decision()


def test_scale_down_stops_at_what_the_demand_still_wants():
    assert scaling.decide(POLICY, ModelLoad(demand=4, live=3), NEVER, PERIOD) == Decision(stop=1)
    assert scaling.decide(POLICY, ModelLoad(demand=4, live=2), NEVER, PERIOD) == Decision()


def test_min_workers_are_started_without_demand_and_never_stopped():
    policy = ScalingPolicy(min_workers=2, max_workers=4, target_inflight=1)
    assert scaling.decide(policy, ModelLoad(demand=0, live=0), NEVER, PERIOD) == Decision(start=2)
    assert scaling.decide(policy, ModelLoad(demand=0, live=2), NEVER, PERIOD) == Decision()
    assert scaling.decide(policy, ModelLoad(demand=0, live=3), NEVER, PERIOD) == Decision(stop=1)


def test_more_workers_than_max_come_down_gradually():
    # e.g. the model's max was lowered while 3 ran
    policy = ScalingPolicy(max_workers=1, target_inflight=1)
    assert scaling.decide(policy, ModelLoad(demand=9, live=3), NEVER, PERIOD) == Decision(stop=1)


def test_to_stop_picks_the_most_recently_started():
    assert scaling.to_stop(["a", "b", "c"], 1) == ["c"]
    assert scaling.to_stop(["a", "b", "c"], 2) == ["b", "c"]
    assert scaling.to_stop(["a"], 0) == []
    assert scaling.to_stop([], 1) == []

