"""The warm pool with real processes: ``naiad serve`` and its ``naiad worker --pool`` children.

A pool process holds no model until a cold start claims it; it then serves exactly as a
bare worker would. The pool refills, shrinks to zero after its idle timeout when asked, and
never outlives the server (the harness checks for leftovers at teardown)."""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from naiad_harness import ROOT, wait_for
from prom_text import parse

from naiad_cli.commands import build_parser, parse_worker_command


def infer(server, x: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer("digits", [tensor]).as_numpy("label")
    finally:
        client.close()


def one_pool_process(server) -> psutil.Process:
    [process] = wait_for(server.pool_processes, 30, "one idle warm-pool process")
    return process


def counter(server, name: str, model: str = "digits") -> float:
    return parse(server.metrics()).value(name, model=model)


@pytest.fixture
def x_and_labels(digits_holdout, digits_onnx):
    x = np.ascontiguousarray(digits_holdout[0][:5])
    return x, digits_onnx.run(["label"], {"input": x})[0]


def test_a_cold_start_claims_the_pool_process_and_the_pool_refills(naiad_server, x_and_labels):
    x, expected = x_and_labels
    server = naiad_server(idle_timeout_s=30, extra_args=["--warm-pool-size", "1"])
    pooled = one_pool_process(server)
    assert server.workers("digits") == 0 and server.workers("silero_vad") == 0  # holds no model
    assert server.worker_processes("digits") == []

    np.testing.assert_array_equal(infer(server, x), expected)
    assert server.worker_processes("digits") == [pooled]  # the same process, now digits'
    # ... and `ps` says so: its title is the worker command it runs, no longer `worker --pool`.
    title = pathlib.Path(f"/proc/{pooled.pid}/cmdline").read_bytes().rstrip(b"\0").decode()
    assert title.startswith("naiad worker --model digits ") and "--pool" not in title
    assert server.workers("digits") == 1
    assert counter(server, "naiad_cold_starts_total") == 1
    assert counter(server, "naiad_warm_pool_claims_total") == 1
    assert counter(server, "naiad_model_loads_total") == 1
    assert "model 'digits' ready" in server.log() and "after the claim" in server.log()

    refill = one_pool_process(server)  # a new idle one took its place
    assert refill.pid != pooled.pid
    assert server.workers("silero_vad") == 0
    np.testing.assert_array_equal(infer(server, x), expected)  # served warm: no new claim
    assert counter(server, "naiad_cold_starts_total") == 1
    assert server.pool_processes() == [refill]


def test_pool_size_zero_spawns_a_bare_worker(naiad_server, x_and_labels):
    x, expected = x_and_labels
    server = naiad_server(extra_args=["--warm-pool-size", "0"])
    assert server.worker_processes() == []
    np.testing.assert_array_equal(infer(server, x), expected)
    [worker] = server.worker_processes("digits")
    assert "--model" in worker.cmdline() and "--pool" not in worker.cmdline()
    assert counter(server, "naiad_cold_starts_total") == 1
    assert counter(server, "naiad_warm_pool_claims_total") == 0
    assert "after the process started" in server.log()
    assert server.pool_processes() == []


def test_pool_processes_die_with_a_killed_server(naiad_server):
    server = naiad_server(extra_args=["--warm-pool-size", "2"])
    pooled = wait_for(lambda: len(server.pool_processes()) == 2 and server.pool_processes(), 30, "2 pooled")
    server.process.send_signal(signal.SIGKILL)  # no shutdown path: only PR_SET_PDEATHSIG
    server.process.wait(10)
    _, alive = psutil.wait_procs(pooled, timeout=10)
    assert alive == []


def test_the_pool_shrinks_to_zero_after_its_idle_timeout_and_refills_on_a_cold_start(
    naiad_server, x_and_labels
):
    x, expected = x_and_labels
    server = naiad_server(idle_timeout_s=30, extra_args=["--warm-pool-idle-timeout", "4"])
    wait_for(lambda: not server.pool_processes(), 30, "the pool to shrink to zero")
    np.testing.assert_array_equal(infer(server, x), expected)  # nothing pooled: a bare process
    [worker] = server.worker_processes("digits")
    assert "--model" in worker.cmdline()
    assert counter(server, "naiad_warm_pool_claims_total") == 0
    one_pool_process(server)  # the cold start refilled the pool ...
    wait_for(lambda: not server.pool_processes(), 30, "the pool to shrink again")  # ... until idle
    assert server.worker_processes("digits") == [worker]  # workers are not the pool's to stop


def test_a_pool_process_exits_when_its_stdin_closes(redis_url, example_repository, tmp_path):
    command = [sys.executable, "-m", "naiad_cli", "worker", "--pool", "--redis-url", redis_url,
               "--model-repository", str(example_repository), "--cache-dir", str(tmp_path)]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    _, stderr = process.communicate(b"", timeout=60)
    assert process.returncode == 0, stderr.decode()


def test_a_claim_names_a_worker_command_line():
    settings, model = parse_worker_command(["worker", "--model", "digits", "--idle-timeout", "7"])
    assert model == "digits" and settings.idle_timeout_s == 7
    with pytest.raises(ValueError):
        parse_worker_command(["worker", "--pool"])
    args = build_parser().parse_args(["serve", "--warm-pool-size", "3", "--warm-pool-idle-timeout", "9"])
    assert (args.warm_pool_size, args.warm_pool_idle_timeout_s) == (3, 9.0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--model", "digits", "--pool"])  # one or the other


def maps_torch(process: psutil.Process) -> bool:
    """True once ``process`` has torch's shared library mapped (it imported torch)."""
    try:
        return "libtorch_cpu" in pathlib.Path(f"/proc/{process.pid}/maps").read_text()
    except OSError:
        return False


@pytest.fixture(scope="module")
def torch_repository(tmp_path_factory) -> pathlib.Path:
    """``digits`` (ONNX) and ``digits_pytorch`` (TorchScript), built by the example script."""
    out = tmp_path_factory.mktemp("pool_frameworks") / "models"
    subprocess.run([sys.executable, str(ROOT / "examples" / "build_repository.py"), str(out),
                    "--model", "digits", "--model", "digits_pytorch"],
                   check=True, capture_output=True, timeout=110)  # fmt: skip
    return out


def test_each_framework_has_its_own_pool_and_a_model_claims_its_framework(
    naiad_server, torch_repository, x_and_labels
):
    """``--warm-pool-backend onnxruntime --warm-pool-backend pytorch``: one idle process per
    backend, the PyTorch one with torch already imported (mapped) before any claim, the ONNX
    one without it; a TorchScript model at zero claims the PyTorch process, the ONNX model
    the other, and each pool refills with its own framework."""
    x, expected = x_and_labels
    server = naiad_server(repository=torch_repository, idle_timeout_s=30, extra_args=[
        "--warm-pool-backend", "onnxruntime", "--warm-pool-backend", "pytorch"])  # fmt: skip
    pooled = wait_for(lambda: len(server.pool_processes()) == 2 and server.pool_processes(), 30, "2 pooled")
    torch_process = wait_for(lambda: next((p for p in pooled if maps_torch(p)), None), 60, "torch imported")
    [onnx_process] = [p for p in pooled if p.pid != torch_process.pid]
    assert not maps_torch(onnx_process)

    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("input__0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        label = client.infer("digits_pytorch", [tensor]).as_numpy("output__1")
    finally:
        client.close()
    np.testing.assert_array_equal(label.reshape(expected.shape), expected)
    assert [p.pid for p in server.worker_processes("digits_pytorch")] == [torch_process.pid]
    np.testing.assert_array_equal(infer(server, x), expected)
    assert [p.pid for p in server.worker_processes("digits")] == [onnx_process.pid]
    assert counter(server, "naiad_warm_pool_claims_total", "digits_pytorch") == 1
    refilled = wait_for(lambda: len(server.pool_processes()) == 2 and server.pool_processes(), 30, "refilled")
    wait_for(lambda: any(maps_torch(p) for p in refilled), 60, "the PyTorch pool's refill")
    assert [maps_torch(p) for p in refilled].count(True) == 1


def test_a_claim_takes_its_own_backend_else_the_default_pool_never_another_framework(tmp_path):
    """Idle stand-ins (``cat`` reading the claim) in an ONNX Runtime and a PyTorch pool: a
    Python model takes the default (ONNX Runtime) one, an ONNX model then finds none left and
    gets None (a bare process) rather than the PyTorch one, which a TorchScript model still
    gets."""
    from naiad.settings import Settings  # noqa: PLC0415
    from workers.warm_pool import WarmPool  # noqa: PLC0415

    settings = Settings(model_repository=str(tmp_path), cache_dir=tmp_path,
                        warm_pool_backends=["onnxruntime", "pytorch"])  # fmt: skip
    pool = WarmPool(settings, ["cat"], "redis://unused")
    stand_ins = {b: subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
                 for b in pool.backends}  # fmt: skip
    try:
        for backend, process in stand_ins.items():
            pool.idle[backend].append(process)
        assert pool.claim(["worker", "--model", "py"], "python") is stand_ins["onnxruntime"]
        assert pool.claim(["worker", "--model", "onnx"], "onnxruntime") is None
        assert pool.claim(["worker", "--model", "torch"], "pytorch") is stand_ins["pytorch"]
    finally:
        for process in stand_ins.values():
            process.kill()
            process.wait(5)


def test_a_claim_carries_the_worker_id_the_scaler_gave(tmp_path):
    """The claim an idle pool process reads names the worker id the scaler chose (the
    scaler removes that id's heartbeat when the process dies: workers/scaler.py)."""
    from naiad.settings import Settings  # noqa: PLC0415
    from workers.warm_pool import WarmPool  # noqa: PLC0415

    pool = WarmPool(Settings(model_repository=str(tmp_path), cache_dir=tmp_path), ["cat"], "redis://unused")
    stand_in = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        pool.idle[pool.backends[0]].append(stand_in)
        assert pool.claim(["worker", "--model", "m"], None, "m-0123abcd") is stand_in
        assert stand_in.stdout is not None
        claim = json.loads(stand_in.stdout.read())  # cat echoes it; the claim closed its stdin
    finally:
        stand_in.kill()
        stand_in.wait(5)
        if stand_in.stdout is not None:
            stand_in.stdout.close()
    assert claim["worker_id"] == "m-0123abcd" and claim["command"] == ["worker", "--model", "m"]
