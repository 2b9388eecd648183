"""The traffic rules between versions as pure functions (naiad/rollout.py)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from naiad import rollout
from naiad.rollout import RolloutPolicy, parse_rollout, pick_version, without


def test_a_90_10_canary_lands_within_5_percent_over_2000_requests() -> None:
    split = rollout.parse_split("1:90,2:10", [1, 2])
    draw = random.Random(7).random
    counts = Counter(pick_version(split, "m", None, draw) for _ in range(2000))
    assert abs(counts[1] / 2000 - 0.90) <= 0.05 and abs(counts[2] / 2000 - 0.10) <= 0.05
    keyed = Counter(pick_version(split, "m", f"user-{i}") for i in range(2000))
    assert abs(keyed[2] / 2000 - 0.10) <= 0.05  # route keys spread by weight too


def test_the_same_route_key_always_gets_the_same_version() -> None:
    split = rollout.parse_split("1:50,2:50", [1, 2])
    for key in ("alice", "bob", "carol", "d" * 300, "ünïcode"):
        first = pick_version(split, "m", key)
        assert {pick_version(split, "m", key, random.Random(n).random) for n in range(20)} == {first}
    assert len({pick_version(split, "m", f"k{i}") for i in range(50)}) == 2


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("1:90,2:20", "sum to 110"),
        ("1:90,3:10", "version 3 is not served"),
        ("1:50,1:50", "given twice"),
        ("1:90;2:10", "is not 'version:number'"),
        ("one:100", "is not 'version:number'"),
        ("1:-10,2:110", "is not 'version:number'"),
        ("", "is not 'version:number'"),
    ],
)
def test_an_invalid_split_is_ignored_with_a_warning(text: str, problem: str) -> None:
    policy, problems = parse_rollout({rollout.SPLIT_KEY: text}, [1, 2])
    assert policy.split == () and not policy.active
    assert len(problems) == 1 and problem in problems[0] and "ignored" in problems[0]


def test_other_invalid_values_are_ignored_one_by_one() -> None:
    parameters = {rollout.SPLIT_KEY: "1:90,2:10", rollout.SHADOW_KEY: "2:0",
                  rollout.RATE_KEY: "1.5", rollout.MIN_REQUESTS_KEY: "x"}  # fmt: skip
    policy, problems = parse_rollout(parameters, [1, 2])
    assert policy == RolloutPolicy(split=((1, 90), (2, 10)))
    assert [p.split("=")[0] for p in problems] == [
        f"parameter {k}" for k in (rollout.SHADOW_KEY, rollout.RATE_KEY, rollout.MIN_REQUESTS_KEY)
    ]
    policy, problems = parse_rollout({rollout.RATE_KEY: "0.05"}, [1, 2])
    assert policy.rollback_error_rate is None and "needs a valid" in problems[0]


def test_a_valid_policy() -> None:
    parameters = {rollout.SPLIT_KEY: " 2:10 , 1:90", rollout.SHADOW_KEY: "2:25",
                  rollout.RATE_KEY: "0.05", rollout.MIN_REQUESTS_KEY: "20"}  # fmt: skip
    policy, problems = parse_rollout(parameters, [1, 2])
    assert problems == []
    assert policy == RolloutPolicy(((1, 90), (2, 10)), (2, 25), 0.05, 20)


def test_rolled_back_versions_give_their_weight_to_the_others() -> None:
    assert without(((1, 90), (2, 10)), {2}) == ((1, 100),)
    assert without(((1, 33), (2, 33), (3, 34)), {3}) == ((1, 50), (2, 50))
    assert sum(w for _, w in without(((1, 1), (2, 1), (3, 1), (4, 97)), {4})) == 100
    assert without(((1, 100),), {1}) == ()


def test_shadow_copies_take_their_share_and_never_copy_the_shadow_itself() -> None:
    policy = RolloutPolicy(shadow=(2, 25))
    draw = random.Random(3).random
    copies = sum(rollout.shadow_copy(policy, 1, draw) == 2 for _ in range(4000))
    assert abs(copies / 4000 - 0.25) <= 0.03
    assert rollout.shadow_copy(policy, 2, lambda: 0.0) is None
    assert rollout.shadow_copy(RolloutPolicy(), 1, lambda: 0.0) is None


def test_the_failure_ratio_needs_its_minimum_of_requests() -> None:
    policy = RolloutPolicy(((1, 90), (2, 10)), rollback_error_rate=0.05, rollback_min_requests=50)
    assert rollout.failure_ratio_passed([False] * 49, policy) is None
    assert rollout.failure_ratio_passed([True] * 47 + [False] * 3, policy) == pytest.approx(0.06)
    assert rollout.failure_ratio_passed([True] * 48 + [False] * 2, policy) is None
    assert rollout.failure_ratio_passed([False] * 50, RolloutPolicy()) is None
