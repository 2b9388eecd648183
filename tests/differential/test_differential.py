"""The differential suite: the same requests to real Triton 2.51 and to ``naiad serve`` on one
repository (:mod:`tests.differential.repository`), answers compared field by field.

Every difference must be accepted by a row of :mod:`tests.differential.accepted` (the one
table, also in docs/protocol.md); a row that accepts nothing fails too.
"""

from __future__ import annotations

import json
import pathlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from tests.differential import accepted
from tests.differential.cases import grpc_cases, http_cases, js, jtensor
from tests.differential.compare import diff, send_grpc, send_http

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
pytestmark = pytest.mark.timeout(300)


def _differences(transport: str, results: list[tuple[str, Any, Any]]) -> list[tuple[str, str, str, Any, Any]]:
    return [(transport, case, *found) for case, a, b in results for found in diff(a, b)]


@pytest.fixture(scope="module")
def differences(servers, stubs) -> list[tuple[str, str, str, Any, Any]]:
    """Every ``(transport, case, path, triton, naiad)`` that differs, over all cases, and
    the statistics counts that differ after the agreeing cases (:func:`_statistics_differences`)."""
    triton, naiad = servers
    http = [
        (
            case.id,
            send_http("127.0.0.1", triton.http_port, case),
            send_http("127.0.0.1", naiad.http_port, case),
        )
        for case in http_cases()
    ]
    grpc = [(case.id, send_grpc(stubs[0], case), send_grpc(stubs[1], case)) for case in grpc_cases()]
    found = _differences("http", http) + _differences("grpc", grpc)
    answered_otherwise = {(t, c) for t, c, path, *_ in found if path != "content_type"}
    return found + _statistics_differences(servers, stubs, answered_otherwise)


def test_every_difference_is_accepted(differences):
    unexplained = [d for d in differences if accepted.explained(*d) is None]
    shown = "\n".join(
        f"{t} {c} :: {p} :: triton={a!r:.300} naiad={b!r:.300}" for t, c, p, a, b in unexplained
    )
    assert not unexplained, f"{len(unexplained)} differences from Triton no table row accepts:\n{shown}"


def test_every_accepted_row_is_still_needed(differences):
    used = {id(accepted.explained(*d)) for d in differences}
    stale = [row for row in accepted.ACCEPTED + accepted.PENDING if id(row) not in used]
    assert not stale, (
        "rows that accept no difference any more (remove them here and in docs/protocol.md):\n"
        + ("\n".join(row.what() for row in stale))
    )


def test_the_cases_are_a_few_hundred():
    assert len(http_cases()) + len(grpc_cases()) >= 300


def test_docs_carry_the_table():
    assert accepted.render_table() in DOCS.read_text(), (
        "docs/protocol.md must hold accepted.render_table() verbatim:\n" + accepted.render_table()
    )


def _infer(base: str, model: str, body: dict[str, Any]) -> dict[str, Any]:
    response = requests.post(f"{base}/v2/models/{model}/infer", data=js(body), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _rows_seen(base: str, count: int) -> list[int]:
    body = {"inputs": [jtensor("IN", "INT32", [1, 1], [7])]}
    with ThreadPoolExecutor(count) as pool:
        answers = list(pool.map(lambda _: _infer(base, "batcher", body), range(count)))
    return sorted(answer["outputs"][0]["data"][0] for answer in answers)


def test_dynamic_batcher_sends_a_preferred_size_at_once(servers):
    """preferred_batch_size [4, 8], a long delay, six concurrent requests: a batch of 4 goes
    at once, the other 2 after the delay (Triton batcher.md), on both servers."""
    for server in servers:  # Naiad: a warm worker (the same request to both: same statistics)
        _infer(server.http, "batcher", {"inputs": [jtensor("IN", "INT32", [1, 1], [0])]})
    with ThreadPoolExecutor(2) as pool:
        seen = list(pool.map(lambda server: _rows_seen(server.http, 6), servers))
    assert seen[0] == [2, 2, 4, 4, 4, 4], f"Triton ran {seen[0]}"
    assert seen[1] == seen[0], f"Naiad ran {seen[1]}, Triton {seen[0]}"


def _stats(base: str, model: str) -> dict[str, Any]:
    response = requests.get(f"{base}/v2/models/{model}/stats", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["model_stats"][0]


def _counts(stats: dict[str, Any]) -> dict[str, Any]:
    inference = {k: v["count"] for k, v in stats["inference_stats"].items()}
    return {"inference_count": stats["inference_count"], "execution_count": stats["execution_count"],
            **inference}  # fmt: skip


def _structure(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _structure(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_structure(v) for v in value[:1]]
    return type(value).__name__


MODELS = ["identity", "fixed", "add_sub", "versioned", "versioned_latest", "versioned_specific",
          "versioned_default", "failing", "ens"]  # fmt: skip


def _all_counts(base: str) -> dict[str, dict[str, dict[str, int]]]:
    """Counts by model and version (``_counts``), every model of :data:`MODELS`."""
    found = {}
    for model in MODELS:
        response = requests.get(f"{base}/v2/models/{model}/stats", timeout=10)
        assert response.status_code == 200, response.text
        found[model] = {s["version"]: _counts(s) for s in response.json()["model_stats"]}
    return found


def _delta(before: dict, after: dict) -> dict:
    return {m: {v: {k: n - before[m].get(v, {}).get(k, 0) for k, n in c.items()} for v, c in versions.items()}
            for m, versions in after.items()}  # fmt: skip


def _statistics_differences(servers, stubs, differing: set[tuple[str, str]]) -> list[tuple]:
    """The cases both servers answer alike (``differing``: those they do not, by transport
    and case id), sent again: every model's counts (requests,
    executions, successes, failures, queue, compute phases) must grow alike on both. A count
    that differs is ``("stats", model, "<version>.<count>", triton, naiad)``."""
    http = [case for case in http_cases() if ("http", case.id) not in differing]
    grpc = [case for case in grpc_cases() if ("grpc", case.id) not in differing]
    deltas = []
    for server, stub in zip(servers, stubs, strict=True):
        before = _all_counts(server.http)
        for case in http:
            send_http("127.0.0.1", server.http_port, case)
        for case in grpc:
            send_grpc(stub, case)
        deltas.append(_delta(before, _all_counts(server.http)))
    return [("stats", model, *d) for model in MODELS for d in diff(deltas[0][model], deltas[1][model])]


def test_statistics_structure_agrees(servers):
    shapes = [_structure(_stats(server.http, "identity")) for server in servers]
    assert json.dumps(shapes[1], sort_keys=True) == json.dumps(shapes[0], sort_keys=True)


def test_response_cache_answers_and_statistics_agree(servers):
    """Three identical requests and one other to the cached model: the same answers (a hit
    repeats the first execution's COUNT) and the same statistics counts on both servers,
    ``queue.count`` including the hits."""
    answers, counts, shapes = [], [], []
    for server in servers:
        bodies = [{"inputs": [jtensor("IN", "FP32", [2], [1.5, 2.0])]}] * 3 + [
            {"inputs": [jtensor("IN", "FP32", [2], [0.0, 1.0])]}
        ]
        answers.append([_infer(server.http, "cached", body)["outputs"] for body in bodies])
        stats = _stats(server.http, "cached")
        counts.append(_counts(stats))
        shapes.append(_structure(stats))
    assert answers[0] == answers[1]
    assert counts[0]["cache_hit"] == 2 and counts[0]["queue"] == 4, counts[0]
    assert counts[1] == counts[0], f"Naiad {counts[1]}, Triton {counts[0]}"
    assert json.dumps(shapes[1], sort_keys=True) == json.dumps(shapes[0], sort_keys=True)
