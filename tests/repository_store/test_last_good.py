"""Last known good (Triton's "if the reload fails for any reason the already loaded model will
be unchanged and will remain loaded", model_management.md), per version, as a pure rule."""

from __future__ import annotations

from rs_helpers import onnx_config

from naiad.registry import READY, UNAVAILABLE, ModelEntry
from repository_store import keep_last_good, parse_config

CONFIG = parse_config(onnx_config("m").encode(), "m")
OTHER = parse_config(onnx_config("m", "version_policy { all { } }").encode(), "m")


def serving(versions: list[int]) -> ModelEntry:
    return ModelEntry("m", CONFIG, versions, READY)


def test_a_clean_change_replaces_what_served() -> None:
    candidate = ModelEntry("m", OTHER, [2], READY)
    assert keep_last_good(serving([1]), candidate) == candidate


def test_nothing_serving_takes_the_candidate_as_it_is() -> None:
    broken = ModelEntry("m", None, reason="config.pbtxt: parse error")
    assert keep_last_good(None, broken) == broken
    unloaded = ModelEntry("m", None, [1], UNAVAILABLE, "unloaded")
    assert keep_last_good(unloaded, broken) == broken


def test_a_config_that_does_not_parse_keeps_the_previous_entry() -> None:
    previous = serving([1])
    kept = keep_last_good(previous, ModelEntry("m", None, reason="config.pbtxt: parse error"))
    assert (kept.state, kept.config, kept.versions, kept.failed) == (READY, CONFIG, [1], {})
    assert kept.reason == "reload failed (still serving version 1): config.pbtxt: parse error"


def test_a_new_version_that_fails_to_load_keeps_the_old_one_and_is_listed_failed() -> None:
    candidate = ModelEntry("m", CONFIG, [2], READY).load_failed("bad file", 2)
    assert (candidate.state, candidate.versions) == (UNAVAILABLE, [2])
    kept = keep_last_good(serving([1]), candidate)
    assert (kept.state, kept.versions, kept.failed) == (READY, [1], {2: "bad file"})
    assert kept.reason.startswith("reload failed (still serving version 1)")


def test_one_failing_version_never_touches_the_others() -> None:
    candidate = ModelEntry("m", CONFIG, [1, 2, 3], READY).load_failed("v3 broken", 3)
    assert (candidate.state, candidate.versions, candidate.failed) == (READY, [1, 2], {3: "v3 broken"})
    kept = keep_last_good(serving([1, 2]), candidate)
    assert (kept.versions, kept.failed) == ([1, 2], {3: "v3 broken"})
    assert keep_last_good(kept, ModelEntry("m", CONFIG, [1, 2, 3], READY)).versions == [1, 2, 3]


def test_a_fixed_upload_after_a_failure_goes_live() -> None:
    kept = keep_last_good(serving([1]), ModelEntry("m", None, reason="parse error"))
    fixed = ModelEntry("m", OTHER, [1], READY)
    assert keep_last_good(kept, fixed) == fixed


def test_the_same_failure_twice_writes_the_same_entry() -> None:
    """Every gateway polls: the second one's result equals what the first one wrote."""
    candidate = ModelEntry("m", CONFIG, [2], READY).load_failed("bad file", 2)
    once = keep_last_good(serving([1]), candidate)
    assert keep_last_good(once, candidate) == once
