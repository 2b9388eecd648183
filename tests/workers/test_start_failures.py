"""``workers.start_failures``: backoff and the UNAVAILABLE verdict for workers that die
before they report (pure policy, no processes)."""

from __future__ import annotations

import signal

from workers.start_failures import BACKOFF_S, MAX_BACKOFF_S, StartFailures, describe_exit, is_early_failure


def test_the_second_early_exit_in_a_row_marks_and_each_backs_off():
    failures = StartFailures()
    assert failures.may_start("m", 0.0)
    assert not failures.failed("m", 10.0)
    assert not failures.may_start("m", 10.0 + BACKOFF_S / 2) and failures.may_start("m", 10.0 + BACKOFF_S)
    assert failures.failed("m", 20.0)  # the second: mark now
    assert not failures.may_start("m", 20.0 + BACKOFF_S)  # doubled
    failures.marked("m")  # marked: the backlog's worker starts at once
    assert failures.may_start("m", 20.0)
    assert "code 7" in failures.reason("m", 7) and "2 times in a row" in failures.reason("m", 7)


def test_backoff_is_capped_and_a_ready_worker_clears_it():
    failures = StartFailures()
    for _ in range(20):
        failures.failed("m", 0.0)
    assert failures.may_start("m", MAX_BACKOFF_S) and not failures.may_start("m", MAX_BACKOFF_S - 0.1)
    failures.succeeded("m")
    assert failures.may_start("m", 0.0) and not failures.failed("m", 0.0)  # counting from one again


def test_what_counts_as_an_early_failure():
    assert is_early_failure(7, False) and is_early_failure(-signal.SIGSEGV, False)
    assert not is_early_failure(0, False)  # idle exit
    assert not is_early_failure(2, False)  # the load failed and the worker said why
    assert not is_early_failure(7, True)  # it served first: a crash, reclaimed as usual
    assert not is_early_failure(7, None)  # not one of ours
    assert describe_exit(-signal.SIGSEGV) == "signal SIGSEGV" and describe_exit(3) == "code 3"
