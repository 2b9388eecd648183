"""``--gateway-processes 2`` end to end (:mod:`gateway.siblings`): a real ``naiad serve``
whose two gateway processes share its HTTP and gRPC ports. Every call here goes on a new
connection, which the kernel gives to either process, and the server must look like one:
the statistics count every request whichever process answered it, model control and
shared-memory regions are seen by every connection at once, and the second process dies
with the first."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import psutil
import pytest
import requests
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from naiad_harness import run_server, wait_for

from gateway import siblings
from naiad.host import usable_cpus

ARGS = ["--gateway-processes", "2", "--model-control-mode", "explicit", "--load-model", "digits"]
#: Calls made on new connections: all on one process would happen with probability 2^-(N-1).
FRESH = 24


@pytest.fixture(scope="module")
def serve(example_repository, tmp_path_factory):
    with run_server(example_repository, tmp_path_factory.mktemp("gateways"), extra_args=ARGS) as server:
        yield server


def gateways(server) -> list[psutil.Process]:
    """The server's gateway processes: ``naiad serve`` itself and its sibling (a child
    running ``naiad_cli gateway``)."""
    parent = psutil.Process(server.process.pid)
    return [parent, *(c for c in parent.children() if "gateway" in c.cmdline())]


def body(x: np.ndarray) -> dict:
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
    return {"inputs": [tensor], "outputs": [{"name": "label"}]}


def gone(process: psutil.Process) -> bool:
    return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE


def infer(server, x: np.ndarray) -> np.ndarray:
    """One inference on a new connection (``requests`` without a session opens one a call)."""
    response = requests.post(f"{server.http}/v2/models/digits/infer", json=body(x), timeout=30)
    assert response.status_code == 200, response.text
    return np.array(response.json()["outputs"][0]["data"])


def stats(server) -> dict:
    response = requests.get(f"{server.http}/v2/models/digits/stats", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["model_stats"][0]


def test_both_processes_hold_connections_and_answer_right(serve, digits_holdout, digits_onnx):
    processes = gateways(serve)
    assert len(processes) == 2, processes
    sibling = processes[1]  # its settings came through a pipe: no Redis URL where ps shows it
    assert sibling.cmdline()[1:] == ["-m", "naiad_cli", "gateway"]
    assert not [v for v in sibling.environ().values() if "redis://" in v or "unix://" in v]
    sessions = [requests.Session() for _ in range(FRESH)]
    x = digits_holdout[0][:2]
    want = digits_onnx.run(["label"], {"input": x})[0].ravel()
    try:
        for session in sessions:  # each opens its connection and keeps it
            answer = session.post(f"{serve.http}/v2/models/digits/infer", json=body(x), timeout=30).json()
            np.testing.assert_array_equal(answer["outputs"][0]["data"], want)
        port = int(serve.http.rsplit(":", 1)[1])
        held = [[c for c in p.net_connections("tcp") if c.laddr.port == port] for p in processes]
        holding = [sum(1 for c in cs if c.status == psutil.CONN_ESTABLISHED) for cs in held]
        assert sum(holding) == FRESH and all(holding), holding
    finally:
        for session in sessions:
            session.close()


def test_statistics_count_every_process_s_requests(serve, digits_holdout, digits_onnx):
    """Counters a process holds for a few ms before writing them are written before any
    process answers a statistics read: each read, on a new connection, counts all."""
    before = stats(serve)
    x = digits_holdout[0]
    want = digits_onnx.run(["label"], {"input": x[:FRESH]})[0].ravel()
    for i in range(FRESH):
        np.testing.assert_array_equal(infer(serve, x[i : i + 1]), want[i : i + 1])
    for _ in range(6):
        after = stats(serve)
        assert after["inference_count"] - before["inference_count"] == FRESH
        success = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
        assert success == FRESH


def test_model_control_is_seen_by_every_connection_at_once(serve, digits_holdout):
    ready = f"{serve.http}/v2/models/digits/ready"
    unload = requests.post(f"{serve.http}/v2/repository/models/digits/unload", timeout=60)
    assert unload.status_code == 200, unload.text
    try:
        assert [requests.get(ready, timeout=10).status_code for _ in range(8)] == [400] * 8
        for _ in range(8):  # an unloaded model is unknown (Triton: 404 / NOT_FOUND)
            refused = requests.post(f"{serve.http}/v2/models/digits/infer", json=body(digits_holdout[0][:1]),
                                    timeout=10)  # fmt: skip
            assert refused.status_code == 404 and "error" in refused.json(), refused.text
    finally:
        load = requests.post(f"{serve.http}/v2/repository/models/digits/load", timeout=120)
    assert load.status_code == 200, load.text
    assert [requests.get(ready, timeout=10).status_code for _ in range(8)] == [200] * 8
    infer(serve, digits_holdout[0][:1])


def test_shared_memory_regions_are_every_process_s(serve, digits_holdout, digits_onnx):
    """A region registered on one connection serves inputs on every other; one unregistered
    is gone from all; a region no process can map is registered on none."""
    rows = 2
    key = f"/naiad_test_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("gwp_in", key, rows * 64 * 4)
    try:
        x = np.ascontiguousarray(digits_holdout[0][:rows], dtype=np.float32)
        shm.set_shared_memory_region(handle, [x])
        register = httpclient.InferenceServerClient(serve.url)
        register.register_system_shared_memory("gwp_in", key, rows * 64 * 4)
        register.close()
        want = digits_onnx.run(["label"], {"input": x})[0]
        for _ in range(FRESH // 2):
            client = httpclient.InferenceServerClient(serve.url)  # a new connection each
            tensor = httpclient.InferInput("input", [rows, 64], "FP32")
            tensor.set_shared_memory("gwp_in", rows * 64 * 4)
            np.testing.assert_array_equal(client.infer("digits", [tensor]).as_numpy("label"), want)
            client.close()
        gone = requests.post(f"{serve.http}/v2/systemsharedmemory/region/gwp_in/unregister", timeout=10)
        assert gone.status_code == 200, gone.text
        status = f"{serve.http}/v2/systemsharedmemory/status"
        assert [requests.get(status, timeout=10).json() for _ in range(6)] == [[]] * 6
        bad = requests.post(f"{serve.http}/v2/systemsharedmemory/region/nope/register",
                            json={"key": "/naiad_no_such_object", "byte_size": 64}, timeout=10)  # fmt: skip
        assert bad.status_code == 400 and "error" in bad.json()
        assert [requests.get(status, timeout=10).json() for _ in range(6)] == [[]] * 6
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_region_in_use_in_one_process_stays_registered_in_all(serve, digits_holdout):
    """A request holds its output region (its worker frozen); an unregister of that region,
    or of all, on any connection is refused as in one process (400 naming it), and every
    process keeps the region; once the request is answered, the unregister goes through."""
    rows, size = 1, 80  # one row's probabilities
    key = f"/naiad_test_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("gwp_out", key, size)
    status = f"{serve.http}/v2/systemsharedmemory/status"
    try:
        client = httpclient.InferenceServerClient(serve.url, network_timeout=60)
        client.register_system_shared_memory("gwp_out", key, size)
        infer(serve, digits_holdout[0][:1])  # a worker up (the one to freeze)
        (worker,) = wait_for(lambda: serve.worker_processes("digits"), 30, "the digits worker")
        tensor = httpclient.InferInput("input", [rows, 64], "FP32")
        tensor.set_data_from_numpy(np.ascontiguousarray(digits_holdout[0][:rows], dtype=np.float32))
        output = httpclient.InferRequestedOutput("probabilities")
        output.set_shared_memory("gwp_out", size)
        results: list = []

        def call() -> None:  # a client of its own on its own thread (gevent inside)
            caller = httpclient.InferenceServerClient(serve.url, network_timeout=60)
            results.append(caller.infer("digits", [tensor], outputs=[output]))
            caller.close()

        worker.send_signal(signal.SIGSTOP)
        thread = threading.Thread(target=call)
        try:
            thread.start()
            time.sleep(1.0)  # the request holds its region in the process that took it
            for path in ("region/gwp_out/unregister", "unregister"):
                for _ in range(4):
                    answer = requests.post(f"{serve.http}/v2/systemsharedmemory/{path}", timeout=10)
                    assert answer.status_code == 400 and "gwp_out" in answer.json()["error"], answer.text
            names = [[r["name"] for r in requests.get(status, timeout=10).json()] for _ in range(8)]
            assert names == [["gwp_out"]] * 8
        finally:
            worker.send_signal(signal.SIGCONT)
            thread.join(60)
        assert results[0].get_output("probabilities")["shape"] == [rows, 10]
        client.close()
        gone = requests.post(f"{serve.http}/v2/systemsharedmemory/region/gwp_out/unregister", timeout=10)
        assert gone.status_code == 200, gone.text
        assert [requests.get(status, timeout=10).json() for _ in range(6)] == [[]] * 6
    finally:
        shm.destroy_shared_memory_region(handle)


def test_the_second_process_dies_with_the_first(example_repository, tmp_path):
    """``naiad serve`` killed (SIGKILL: no shutdown path runs): its sibling gateway exits too
    (and every other child: the harness's stop checks that none is left)."""
    with run_server(example_repository, tmp_path / "server", extra_args=ARGS) as server:
        first, second = gateways(server)
        first.send_signal(signal.SIGKILL)
        server.process.wait(10)
        wait_for(lambda: gone(second), 10, "the sibling gateway to exit")


def test_a_killed_sibling_leaves_the_first_serving(example_repository, tmp_path, digits_holdout, digits_onnx):
    """The sibling killed (SIGKILL: its socket file stays): the ports keep being served by the
    first process, and its statistics reads go on (the dead sibling's socket is dropped)."""
    with run_server(example_repository, tmp_path / "server", extra_args=ARGS) as server:
        _, second = gateways(server)
        second.send_signal(signal.SIGKILL)
        # Reaped, not only a zombie leader: the kernel closes its listening socket when its
        # last thread exits, and a connection hashed to that socket before then is reset.
        wait_for(lambda: "exited (code -9)" in server.log(), 10, "the first process to reap the sibling")
        x = digits_holdout[0][:1]
        want = digits_onnx.run(["label"], {"input": x})[0].ravel()
        before = stats(server)
        for _ in range(4):
            np.testing.assert_array_equal(infer(server, x), want)
        assert stats(server)["inference_count"] - before["inference_count"] == 4
        assert "is gone (asked 'flush')" in server.log()


def test_the_default_runs_one_gateway_process_a_cpu(example_repository, tmp_path):
    """Without ``--gateway-processes`` (the harness passes ``0``, the default, to skip its own
    1), ``naiad serve`` runs one gateway process per usable CPU, at most
    :data:`gateway.siblings.AUTO_MOST`; pinned to one CPU, one (children inherit the affinity)."""
    expected = min(usable_cpus(), siblings.AUTO_MOST)
    with run_server(example_repository, tmp_path / "auto", extra_args=["--gateway-processes=0"]) as server:
        assert len(gateways(server)) == expected
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        with run_server(example_repository, tmp_path / "one", extra_args=["--gateway-processes=0"]) as server:
            assert len(gateways(server)) == 1
            assert requests.get(f"{server.http}/v2/health/ready", timeout=10).status_code == 200
    finally:
        os.sched_setaffinity(0, before)


def test_a_second_server_on_the_same_ports_is_refused(example_repository, tmp_path):
    """The first process binds with ``SO_REUSEPORT`` (shared with its siblings); a second
    ``naiad serve`` of the same user on the same ports must still fail as with one process
    ("address already in use"), not take half of the connections."""
    with run_server(example_repository, tmp_path / "first", extra_args=ARGS) as server:
        second = subprocess.run(
            [sys.executable, "-m", "naiad_cli", "serve", "--model-repository", str(example_repository),
             "--http-port", str(server.http_port), "--grpc-port", str(server.grpc_port),
             "--metrics-port", "0", "--cache-dir", str(tmp_path / "second-cache")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 1, second.stderr[-2000:]
        assert "address already in use" in second.stderr.lower(), second.stderr[-2000:]
        assert requests.get(f"{server.http}/v2/health/ready", timeout=10).status_code == 200


def test_the_connection_limit_is_the_servers_not_each_processes(example_repository, tmp_path):
    """``--http-max-connections 4`` with two processes: each holds 2 (``per_process``), so at
    most 4 connections stay open in all, whichever process the kernel gives each one; the
    others are answered 503 and closed."""
    args = ["--gateway-processes", "2", "--http-max-connections", "4"]
    with run_server(example_repository, tmp_path / "server", extra_args=args) as server:
        sockets = [socket.create_connection(("127.0.0.1", server.http_port), timeout=10) for _ in range(12)]
        try:
            held = 0
            for sock in sockets:
                sock.settimeout(1.5)
                try:
                    got = sock.recv(200)
                except TimeoutError:
                    held += 1  # open and waiting for a request
                    continue
                assert got.startswith(b"HTTP/1.1 503"), got
            assert 2 <= held <= 4, held
        finally:
            for sock in sockets:
                sock.close()
