"""The BLS client's own event loop (:mod:`workers.bls`), against a real ``naiad serve`` on a
private redis-server serving the example ``digits`` model (ONNX Runtime, real workers).

A Python model's ``execute`` may run on the worker's event-loop thread: a blocking
``exec()`` made there must still be answered, which needs the dispatcher on a loop of its
own ("naiad-bls"). On a dispatcher living on the caller's loop that call never returns, so
the scenario runs in a thread of its own and the test fails, not hangs, when it stays stuck.
"""

from __future__ import annotations

import asyncio
import shutil
import threading

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils
from naiad.settings import Settings
from workers import bls

#: Seconds the scenario may take: a cold start of ``digits`` included.
SCENARIO_S = 120


@pytest.fixture
def digits_server(naiad_server, example_repository, redis_url, tmp_path):
    """``naiad serve`` of ``digits`` alone, on the test's private redis-server."""
    repository = tmp_path / "models"
    shutil.copytree(example_repository / "digits", repository / "digits")
    return naiad_server(repository, redis_url=redis_url)


def digits_call(rows: np.ndarray) -> pb_utils.InferenceRequest:
    return pb_utils.InferenceRequest(model_name="digits", requested_output_names=["label"],
                                     inputs=[pb_utils.Tensor("input", rows)])  # fmt: skip


def bls_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == bls.THREAD_NAME]


def run_in_thread(scenario) -> dict:
    """``asyncio.run(scenario())`` in a daemon thread, waited for at most :data:`SCENARIO_S`;
    what it returned (``result``) or raised (``error``). Fails when it is still running."""
    outcome: dict = {}

    def main() -> None:
        try:
            outcome["result"] = asyncio.run(scenario())
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=main, name="worker-loop", daemon=True)
    thread.start()
    thread.join(SCENARIO_S)
    assert not thread.is_alive(), "a BLS call made on a blocked event loop was never answered"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def test_exec_on_a_blocked_worker_loop_is_answered_and_close_ends_the_thread(
    digits_server, redis_url, digits_holdout, digits_onnx
):
    """``exec()`` called on the loop ``install`` was called on, blocking it as ``execute`` run
    on the worker's loop does, gets its answer; ``async_exec()`` calls in flight together on
    that loop too. Nothing starts before the first call; ``close()`` ends the "naiad-bls"
    thread, a second close does nothing and a call after it is answered at once with an error."""
    x = digits_holdout[0][:4]
    expected = digits_onnx.run(["label"], {"input": x})[0]

    async def worker_loop():
        calls = bls.install(Settings(), redis_url, "bls-loop-test")
        try:
            started_early = bls_threads()
            blocked = digits_call(x[:2]).exec()  # blocks this loop until answered
            gathered = await asyncio.gather(*(digits_call(x[i : i + 1]).async_exec() for i in (2, 3)))
        finally:
            await calls.close()
            await calls.close()
            pb_utils._install_bls(None)  # noqa: SLF001 - as a worker process ends with none
        return started_early, blocked, gathered, bls_threads(), calls.submit(digits_call(x[:1]))

    started_early, blocked, gathered, left, after_close = run_in_thread(worker_loop)
    assert started_early == []
    assert not blocked.has_error(), blocked.error().message()
    labels = [pb_utils.get_output_tensor_by_name(blocked, "label").as_numpy()]
    for answer in gathered:
        assert not answer.has_error(), answer.error().message()
        labels.append(pb_utils.get_output_tensor_by_name(answer, "label").as_numpy())
    np.testing.assert_array_equal(np.concatenate(labels), expected)
    assert left == []
    refused = after_close.result(timeout=0)
    assert refused.has_error()
    assert (refused.error().code(), refused.error().message()) == (pb_utils.TritonError.INTERNAL, bls.CLOSED)


def test_a_call_still_waiting_when_the_client_closes_is_answered_with_an_error(redis_url):
    """A call sent just before ``close()`` (it is still reading the registry when the close
    work runs on the BLS loop) is answered with the CLOSED error, not left waiting, nor
    cancelled; the thread ends. A close of a client never used starts nothing."""

    async def worker_loop():
        unused = bls.install(Settings(), redis_url, "bls-unused")
        await unused.close()
        untouched = bls_threads()
        calls = bls.install(Settings(), redis_url, "bls-close-test")
        try:
            waiting = asyncio.wrap_future(calls.submit(digits_call(np.zeros((1, 64), np.float32))))
            await calls.close()
            answer = await asyncio.wait_for(waiting, 10)
        finally:
            pb_utils._install_bls(None)  # noqa: SLF001 - as a worker process ends with none
        return untouched, answer, bls_threads()

    untouched, answer, left = run_in_thread(worker_loop)
    assert untouched == [] and left == []
    assert answer.has_error()
    assert (answer.error().code(), answer.error().message()) == (pb_utils.TritonError.INTERNAL, bls.CLOSED)
