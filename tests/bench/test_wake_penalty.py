"""The wake-penalty probe (:mod:`bench.perf.wake_penalty`): it times the real parse, and its
rows are what it says they are."""

from __future__ import annotations

from bench.perf import wake_penalty


def test_the_step_is_the_gateways_parse_of_the_digits_request():
    request = wake_penalty.digits_parse()()
    assert request.model == "digits" and request.inputs[0].shape == [1, 64]


def test_each_row_times_five_calls_after_its_condition(capsys):
    calls = []

    def step():
        calls.append("step")

    def before():
        calls.append("before")

    micros = wake_penalty.timed(step, before, rounds=3)
    assert len(micros) == wake_penalty.CALLS and all(us >= 0 for us in micros)
    assert calls == (["before"] + ["step"] * wake_penalty.CALLS) * 3
    assert wake_penalty.main(["--sleep-ms", "0.2", "--rounds", "20"]) == 0
    table = capsys.readouterr().out
    assert "| hot (back to back) |" in table and "| after a 0.2 ms sleep |" in table
