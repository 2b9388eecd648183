"""Which batches a worker runs on its event loop: :func:`workers.execution.expected_ns`, by
the batch's input elements."""

import math

from workers.execution import INLINE_INFER_S, expected_ns


def test_a_known_size_class_gives_its_last_time() -> None:
    assert expected_ns({1: 40_000, 6: 90_000}, 1) == 40_000
    assert expected_ns({1: 40_000, 6: 90_000}, 32) == 90_000  # 32..63 elements: class 6


def test_a_larger_batch_scales_the_nearest_smaller_class_by_its_size() -> None:
    # one element took 40 µs: 32 are at most 32 x that, above the inline limit
    assert expected_ns({1: 40_000}, 32) == 32 * 40_000 > INLINE_INFER_S * 1e9
    # 4..7 elements took 100 µs: 20 are at most 20/4 x that
    assert expected_ns({3: 100_000}, 20) == 500_000


def test_a_smaller_batch_is_bounded_by_a_larger_class_and_nothing_known_is_infinite() -> None:
    assert expected_ns({6: 90_000, 7: 150_000}, 2) == 90_000
    assert expected_ns({}, 1) == math.inf


def test_a_fast_model_batched_stays_inline_once_its_batch_size_was_seen() -> None:
    """The first round's rule extrapolated one row's time to the whole batch, sending every
    large batch of a fast model to a thread; a measured large batch now keeps it inline."""
    seen = {(64).bit_length(): 60_000}
    assert expected_ns(seen, 32 * 64) >= INLINE_INFER_S * 1e9  # not seen yet: a thread, once
    seen[(32 * 64).bit_length()] = 120_000  # what that batch took
    assert expected_ns(seen, 40 * 64) < INLINE_INFER_S * 1e9
    assert expected_ns(seen, 64) < INLINE_INFER_S * 1e9


def test_the_same_rows_with_far_longer_sequences_go_to_a_thread() -> None:
    """One sequence of 16 tokens took 50 µs; one of 16,384 is another size class, estimated
    at 1,024 x that: a thread, so the loop (heartbeats, claims) never waits on it."""
    seen = {(16).bit_length(): 50_000}
    assert expected_ns(seen, 16) < INLINE_INFER_S * 1e9
    assert expected_ns(seen, 16_384) == 1_024 * 50_000 > INLINE_INFER_S * 1e9


def test_empty_inputs_are_a_size_class_of_their_own() -> None:
    assert expected_ns({0: 20_000}, 0) == 20_000
    assert expected_ns({0: 20_000}, 64) == 64 * 20_000
