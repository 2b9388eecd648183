"""Hypothesis settings of the fuzzers: bounded and deterministic by default (``make test``),
many more random examples with ``NAIAD_FUZZ=long`` or ``pytest --fuzz-long`` (README,
"Fuzzing"). A failure in long mode prints the seed and the shrunk example to replay."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

LONG = os.environ.get("NAIAD_FUZZ", "").lower() == "long"
#: How many times more examples the long mode runs.
LONG_FACTOR = 100


def fuzz_settings(examples: int) -> settings:
    """``examples`` deterministic examples (the same ones every run), or in long mode
    ``examples * LONG_FACTOR`` random ones. No deadline: CI machines are slow."""
    return settings(
        max_examples=examples * LONG_FACTOR if LONG else examples,
        derandomize=not LONG,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        database=None,
    )
