"""The gateway's own gRPC front and grpc.aio (``--grpc-front grpcio``) answer alike.

Two servers on the example repository, one per front; the same tritonclient.grpc calls go to
both and must come back the same: answers, error codes and messages, metadata, a stream, a
deadline. (The rest of the suite runs on the default front; this keeps grpc.aio's path served
and the two in step.)
"""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from naiad_harness import run_server
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def servers(example_repository, tmp_path_factory):
    grpcio = ["--grpc-front", "grpcio"]
    with (
        run_server(example_repository, tmp_path_factory.mktemp("naiad")) as own,
        run_server(example_repository, tmp_path_factory.mktemp("grpcio"), extra_args=grpcio) as aio,
    ):
        yield {"naiad": own, "grpcio": aio}


def _digits(rows: int, dtype=np.float32, name: str = "input") -> list:
    x = np.linspace(0, 16, rows * 64).astype(dtype).reshape(rows, 64)
    tensor = grpcclient.InferInput(name, list(x.shape), "FP32" if dtype == np.float32 else "FP64")
    tensor.set_data_from_numpy(x)
    return [tensor]


def _outcome(call) -> tuple:
    """What a call gave: ("ok", value) or ("error", status, message)."""
    try:
        return ("ok", call())
    except InferenceServerException as exc:
        return ("error", exc.status(), exc.message())


def _calls(client: grpcclient.InferenceServerClient) -> dict[str, tuple]:
    def infer(rows):
        result = client.infer("digits", _digits(rows), request_id="r1")
        return result.get_response().id, result.as_numpy("label").tolist()

    return {
        "infer": _outcome(lambda: infer(3)),
        "large": _outcome(lambda: infer(2000)),  # 512 KiB in, past HTTP/2's first windows
        "wrong input name": _outcome(lambda: client.infer("digits", _digits(1, name="nope"))),
        "wrong datatype": _outcome(lambda: client.infer("digits", _digits(1, np.float64))),
        "unknown model": _outcome(lambda: client.infer("missing", _digits(1))),
        "metadata": _outcome(lambda: client.get_model_metadata("digits", as_json=True)),
        "live": _outcome(client.is_server_live),
        "not ready": _outcome(lambda: client.is_model_ready("missing")),
        "deadline": _outcome(lambda: client.infer("digits", _digits(1), client_timeout=1e-6)),
    }


def test_the_two_fronts_answer_alike(servers):
    got = {}
    for name, server in servers.items():
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            got[name] = _calls(client)
        finally:
            client.close()
    assert got["naiad"]["infer"][0] == "ok" and got["naiad"]["infer"][1][0] == "r1"
    assert got["naiad"]["wrong input name"][0] == "error"
    for case in got["naiad"]:
        # A deadline past on arrival races the handler's own timeout on either front: the
        # status is the same, the message says who noticed first.
        same = slice(0, 2) if case == "deadline" else slice(None)
        assert got["naiad"][case][same] == got["grpcio"][case][same], case
    assert got["naiad"]["deadline"][1] == "StatusCode.DEADLINE_EXCEEDED"


def _streamed(result, error) -> tuple:
    if error is not None:
        return ("error", str(error))
    return (result.get_response().id, result.as_numpy("label").shape)


def test_a_stream_alike(servers):
    answers = {}
    for name, server in servers.items():
        client = grpcclient.InferenceServerClient(server.grpc_url)
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error, into=results: into.put((result, error)))
        try:
            for i in range(1, 6):
                client.async_stream_infer("digits", _digits(i), request_id=str(i))
            client.async_stream_infer("digits", _digits(1, name="nope"), request_id="bad")
            got = [results.get(timeout=30) for _ in range(6)]
        finally:
            client.stop_stream()
            client.close()
        answers[name] = sorted(_streamed(result, error) for result, error in got)
    assert len(answers["naiad"]) == 6 and answers["naiad"] == answers["grpcio"]
