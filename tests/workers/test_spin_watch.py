"""``workers.spin_watch``: a framework thread that busy-waits between batches (ONNX Runtime's
intra-op pool with spinning on, as a ``model.py`` may build it) runs at SCHED_IDLE between
batches and at SCHED_OTHER during them; one that sleeps between batches (spinning off), and
Python's own threads, are left alone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest

from workers import execution, spin_watch
from workers.model_thread import ModelThread
from workers.spin_watch import SpinWatch

pytestmark = pytest.mark.skipif(spin_watch.watch(True) is None, reason="Linux's SCHED_IDLE and /proc")

ROWS, WIDTH = 64, 256


def session(spinning: bool, path):
    """An ONNX Runtime session of one large MatMul with two intra-op threads (so the pool has
    a thread of its own on any machine) and spinning as asked (ONNX Runtime's default: on)."""
    import onnxruntime as ort  # noqa: PLC0415
    from onnx import TensorProto, helper, numpy_helper, save  # noqa: PLC0415

    weight = numpy_helper.from_array(np.ones((WIDTH, WIDTH), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, WIDTH])], [weight],
    )  # fmt: skip
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def idle_threads() -> set[int]:
    found = set()
    for tid in spin_watch.native_threads():
        try:
            if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                found.add(tid)
        except OSError:
            continue
    return found


def batches(watch: SpinWatch, run, count: int = 5, gap_s: float = 0.01) -> None:
    """``count`` batches as the executor runs them, ``gap_s`` apart (no model code between)."""
    for _ in range(count):
        watch.batch_started()
        execution._with_spinners(watch, run)
        watch.batch_ended()
        time.sleep(gap_s)


def test_a_spinning_onnx_runtime_pool_thread_goes_to_sched_idle(tmp_path):
    before = idle_threads()
    sess = session(True, tmp_path / "m.onnx")
    x = np.ones((ROWS, WIDTH), np.float32)
    watch = SpinWatch(check_s=0.0)
    batches(watch, lambda: sess.run(None, {"x": x}))
    assert watch.spinners, "the spinning pool thread was not found"
    assert watch.spinners <= idle_threads() - before  # between batches
    python = {t.native_id for t in threading.enumerate()}
    assert not watch.spinners & python
    watch.batch_started()  # handed over, not computing yet: still idle
    assert watch.spinners <= idle_threads()
    watch.busy()  # computing: the normal policy, a full share of the run
    assert not watch.spinners & idle_threads()
    assert all(os.sched_getscheduler(tid) == os.SCHED_OTHER for tid in watch.spinners)
    watch.batch_ended()
    assert watch.spinners <= idle_threads()
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.full((ROWS, WIDTH), WIDTH, np.float32))


def test_the_model_thread_runs_the_spinners_at_the_normal_policy_for_its_call_only(tmp_path):
    """A batch run in the model's thread: its spinners stay at SCHED_IDLE while the call waits
    for the thread, are at SCHED_OTHER while it runs, and at SCHED_IDLE again as it returns,
    before the awaiting loop runs again (its ``batch_ended`` then moves nothing)."""
    sess = session(True, tmp_path / "m.onnx")
    x = np.ones((ROWS, WIDTH), np.float32)
    watch = SpinWatch(check_s=0.0)
    batches(watch, lambda: sess.run(None, {"x": x}))
    assert watch.spinners, "the spinning pool thread was not found"
    thread = ModelThread()

    def compute() -> set[int]:
        sess.run(None, {"x": x})
        return watch.spinners & idle_threads()

    async def one_batch() -> tuple[set[int], set[int], set[int]]:
        watch.batch_started()
        handed = watch.spinners - idle_threads()
        running = await thread.run(execution._with_spinners, watch, compute)
        return handed, running, watch.spinners - idle_threads()

    handed, running, returned = asyncio.run(one_batch())
    assert (handed, running, returned) == (set(), set(), set())


def test_a_spinner_that_shares_its_core_with_busy_processes_is_found(tmp_path):
    """With four busy processes on its core the pool thread runs for about a fifth of each gap:
    its CPU time alone is under :data:`SPIN_SHARE`, yet it never sleeps (the gateway and the
    client on both cores of a 2-core machine, as in the e2e test)."""
    sess = session(True, tmp_path / "m.onnx")
    x = np.ones((ROWS, WIDTH), np.float32)
    cpu = min(os.sched_getaffinity(0))
    tids = [int(name) for name in os.listdir("/proc/self/task")]
    saved = {tid: os.sched_getaffinity(tid) for tid in tids}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    try:
        for pid in [hog.pid for hog in hogs] + tids:
            os.sched_setaffinity(pid, {cpu})
        for hog in hogs:  # each in its loop (past Python's start) before the batches
            while sum(psutil.Process(hog.pid).cpu_times()[:2]) < 0.2:
                time.sleep(0.02)
        watch = SpinWatch(check_s=0.0)
        batches(watch, lambda: sess.run(None, {"x": x}), count=8)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        for tid, cpus in saved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus)
    assert watch.spinners, "the pool thread that shared its core was not found"


def test_a_pool_that_sleeps_between_batches_and_python_threads_are_left_alone(tmp_path):
    pre = set(spin_watch.native_threads())
    sess = session(False, tmp_path / "m.onnx")
    pool = set(spin_watch.native_threads()) - pre
    assert pool, "the session started no pool thread"
    x = np.ones((ROWS, WIDTH), np.float32)
    stop = threading.Event()
    busy = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)])  # a Python spinner
    busy.start()
    try:
        watch = SpinWatch(check_s=0.0)
        batches(watch, lambda: sess.run(None, {"x": x}))
    finally:
        stop.set()
        busy.join()
    # (another library's pool may still spin from an earlier test: OpenBLAS's after a matmul)
    assert not watch.spinners & (pool | {busy.native_id})


def test_readings_are_taken_once_a_check_period():
    watch = SpinWatch(check_s=60.0)
    watch.batch_ended()
    first = watch._read_at
    time.sleep(spin_watch.MIN_GAP_S * 2)  # one gap long enough: judged, the judgment closed
    watch.batch_started()
    watch.batch_ended()
    assert first is not None and watch._read_at is None  # the second end is inside the period


def test_short_gaps_are_summed_until_they_can_be_judged(tmp_path):
    """Batches back to back (gaps of ~0.1 ms, each under MIN_GAP_S, as a worker under load
    runs them): the gaps are summed, and the spinning pool thread is found."""
    sess = session(True, tmp_path / "m.onnx")
    x = np.ones((ROWS, WIDTH), np.float32)
    for _ in range(3):  # a pool that has run: spinning after each run
        sess.run(None, {"x": x})
    watch = SpinWatch(check_s=60.0)  # one judgment only
    batches(watch, lambda: sess.run(None, {"x": x}), count=spin_watch.MAX_GAPS, gap_s=0.0001)
    assert watch.spinners, "the spinning pool thread was not found"
    assert watch.spinners <= idle_threads()


def test_a_spinner_gone_from_this_process_is_forgotten_before_its_id_is_moved():
    """A spinner's thread exits and its id may be given to another thread, of any process: a
    judgment opening forgets ids that are not this process's threads (another process's
    thread stands for the reused id here), so the next batch does not move it."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        watch = SpinWatch(check_s=0.0)
        watch.spinners.add(other.pid)
        watch.idle()  # as the model's thread leaves a batch (the id is still a live thread)
        os.sched_setscheduler(other.pid, os.SCHED_OTHER, os.sched_param(0))  # undo that move
        watch.batch_ended()  # a judgment opens
        assert other.pid not in watch.spinners
        watch.busy()
        watch.idle()
        assert os.sched_getscheduler(other.pid) == os.SCHED_OTHER
    finally:
        other.kill()
        other.wait()


def test_a_gone_thread_is_skipped():
    assert not spin_watch.set_policy(2**22 + 12345, os.SCHED_IDLE)  # no such thread
    with pytest.raises(OSError):
        spin_watch.read_thread(2**22 + 12345)


def test_the_setting_turns_it_off_and_a_process_that_cannot_restore_leaves_threads_alone(monkeypatch):
    assert spin_watch.watch(False) is None
    assert spin_watch.can_restore()  # this test process may (root or CAP_SYS_NICE here)
    monkeypatch.setattr(spin_watch, "can_restore", lambda: False)
    assert spin_watch.watch(True) is None


def test_a_spinner_gone_is_dropped():
    watch = SpinWatch()
    watch.spinners = {2**22 + 12345}
    watch.batch_ended()
    assert watch.spinners == set()


def test_a_spinner_found_as_a_batch_starts_is_idle_though_the_batch_never_computes(tmp_path):
    """A spinner is judged as a batch starts (:meth:`SpinWatch.batch_started`); when that
    batch fails before its computation (its version's load, a feed the backend refuses), no
    ``busy``/``idle`` follows: the spinner is at SCHED_IDLE all the same, from its judgment
    through the batch's end, not left at the normal policy spinning."""
    sess = session(True, tmp_path / "m.onnx")
    x = np.ones((ROWS, WIDTH), np.float32)
    watch = SpinWatch(check_s=0.0)
    for _ in range(20):
        watch.batch_ended()  # the previous batch's end: a reading
        sess.run(None, {"x": x})  # the pool spins from here (no batch of the watch's: no busy)
        time.sleep(0.002)
        watch.batch_started()  # judged here; then the batch fails before it computes
        if watch.spinners:
            break
    assert watch.spinners, "the spinning pool thread was not found"
    assert watch.spinners <= idle_threads()  # at SCHED_IDLE from the judgment on
    watch.batch_ended()
    assert watch.spinners <= idle_threads()


@pytest.mark.parametrize(
    ("mapped", "expected"),
    [("/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0", True),
     ("/venv/lib/python3.11/site-packages/torch.libs/libgomp-a34b3233.so.1", True),
     ("/opt/intel/lib/libiomp5.so", True),
     ("/usr/lib/llvm-16/lib/libomp.so.5", True),
     ("/venv/site-packages/tensorflow/libtensorflow_framework.so.2", True),
     ("/venv/site-packages/tensorflow/libtensorflow_cc.so.2", False),
     ("/venv/site-packages/onnxruntime/capi/libonnxruntime_providers_shared.so", False),
     ("/venv/site-packages/numpy.libs/libopenblas64_p-r0-0cf96a72.3.23.dev.so", False),
     ("/usr/lib/libompitrace.so", False)],
)  # fmt: skip
def test_a_library_with_static_shares_is_found_in_the_memory_map(tmp_path, mapped, expected):
    line = f"7f9aed800000-7f9aed837000 r-xp 00000000 fe:00 5400416                    {mapped}\n"
    maps = tmp_path / "maps"
    maps.write_text(
        "55d0c0a00000-55d0c0a2b000 r--p 00000000 fe:00 1 /usr/bin/python3.11\n" + line + "[heap]\n"
    )
    assert spin_watch.static_shares_loaded(str(maps)) is expected
    assert spin_watch.static_shares_loaded(str(tmp_path / "gone")) is False


@pytest.mark.parametrize("static_shares", [False, True])
def test_a_python_models_execute_keeps_the_spinners_idle_unless_static_shares_are_loaded(
    tmp_path, monkeypatch, static_shares
):
    """A request-level batch (a ``model.py``'s ``execute``: its own Python around a framework
    run) leaves the spinners at SCHED_IDLE while it runs, unless an OpenMP runtime is loaded
    (static shares: then at SCHED_OTHER, as a framework backend's batch); idle after it."""
    from types import SimpleNamespace  # noqa: PLC0415

    from naiad.codec import QueuedRequest  # noqa: PLC0415
    from naiad.errors import InferenceFailed  # noqa: PLC0415
    from naiad.inference import InferRequest  # noqa: PLC0415

    monkeypatch.setattr(spin_watch, "static_shares_loaded", lambda: static_shares)  # this process's map
    sess = session(True, tmp_path / "m.onnx")
    x = np.ones((ROWS, WIDTH), np.float32)
    watch = SpinWatch(check_s=0.0)
    batches(watch, lambda: sess.run(None, {"x": x}))
    assert watch.spinners, "the spinning pool thread was not found"
    assert watch.static_shares is static_shares  # looked at as the spinner was found
    seen: list[set[int]] = []

    def execute_requests(requests):
        sess.run(None, {"x": x})
        seen.append(watch.spinners & idle_threads())
        return [InferenceFailed("answered") for _ in requests]

    runner = SimpleNamespace(config=SimpleNamespace(max_batch_size=0),
                             backend=SimpleNamespace(execute_requests=execute_requests))  # fmt: skip
    group = [QueuedRequest("q1", InferRequest("m", 1, [], []), "r", 1e12, time.time())]
    watch.batch_started()
    payloads, run = execution.requests_done(runner, group, lambda f, *a: f(*a), watch)
    watch.batch_ended()
    assert len(payloads) == 1 and len(run.queue_ns) == 1
    assert seen == [set() if static_shares else watch.spinners]
    assert watch.spinners <= idle_threads()


def test_a_library_with_static_shares_loaded_after_the_spinners_were_found_is_seen_a_period_later(
    tmp_path, monkeypatch
):
    """A ``model.py`` that imports PyTorch lazily, after the spinners were judged: the next
    judgment (a check period on) looks at the memory map again and turns the rule on."""
    loaded = [False]
    monkeypatch.setattr(spin_watch, "static_shares_loaded", lambda: loaded[0])
    sess = session(True, tmp_path / "m.onnx")
    x = np.ones((ROWS, WIDTH), np.float32)
    watch = SpinWatch(check_s=0.2)
    batches(watch, lambda: sess.run(None, {"x": x}))
    assert watch.spinners, "the spinning pool thread was not found"
    assert watch.static_shares is False and execution.around_model_code(watch) is None
    loaded[0] = True  # the model imports it now
    watch.batch_started()
    watch.batch_ended()
    time.sleep(0.25)  # a check period later
    watch.batch_started()
    watch.batch_ended()
    assert watch.static_shares is True and execution.around_model_code(watch) is watch
