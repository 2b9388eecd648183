"""THE table of accepted differences between real Triton 2.51 and Naiad on the suite's cases.

Each :class:`Accepted` row matches differences by transport, case id and path (``fnmatch``
patterns; paths as :func:`tests.differential.compare.diff` writes them) and, when given, the
two values. A difference no row matches fails the suite, and so does a row that matches
nothing (a fixed difference leaves the table). ``docs/protocol.md`` holds the same table,
rendered by :func:`render_table` (a test checks they agree).

:data:`PENDING` lists differences fixed on another branch ("pending: fixed on another
branch"): the lead empties it when merging those branches.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

ANY = object()


@dataclass(frozen=True)
class Accepted:
    transport: str
    """``http``, ``grpc``, ``stats`` (the statistics counts after the agreeing cases; case: the
    model, path: ``<version>.<count>``) or ``*``."""
    cases: str
    path: str
    reason: str
    triton: Any = ANY
    naiad: Any = ANY

    def matches(self, transport: str, case: str, path: str, triton: Any, naiad: Any) -> bool:
        return (
            fnmatchcase(transport, self.transport)
            and fnmatchcase(case, self.cases)
            and fnmatchcase(path, self.path)
            and (self.triton is ANY or self.triton == triton)
            and (self.naiad is ANY or self.naiad == naiad)
        )

    def what(self) -> str:
        values = ""
        if self.triton is not ANY or self.naiad is not ANY:
            show = lambda v: "any" if v is ANY else f"`{v}`"  # noqa: E731
            values = f": Triton {show(self.triton)}, Naiad {show(self.naiad)}"
        return f"{self.transport} `{self.cases}` `{self.path}`{values}"


ACCEPTED: list[Accepted] = [
    Accepted(
        "http",
        "*",
        "status",
        triton=500,
        naiad=400,
        reason="Triton answers 500 to malformed requests (bad JSON, missing or mistyped fields, wrong "
        "element counts, non-boolean binary flags); the KServe v2 spec and Naiad: 400",
    ),
    Accepted(
        "http",
        "*",
        "content_type",
        triton="text/plain",
        reason="Triton labels empty 200 bodies and some JSON error bodies text/plain; Naiad sends no "
        "type for an empty body and application/json for every JSON body",
    ),
    Accepted("*", "server_metadata", "*.name", reason="the server's own name: `naiad`"),
    Accepted("*", "server_metadata", "*.version", reason="the server's own version"),
    Accepted(
        "*",
        "server_metadata",
        "*.extensions",
        reason="Naiad names the extensions it implements (no sequence batching, shared memory, "
        "trace or logging yet; `statistics` named)",
    ),
    Accepted(
        "http",
        "ready/*",
        "status",
        triton=400,
        naiad=404,
        reason="readiness of an unknown model or version: 404 like every other request naming one",
    ),
    Accepted(
        "http",
        "metadata/version_word",
        "status",
        triton=404,
        naiad=400,
        reason="a version that is not a number is a malformed request (400), not an unknown one",
    ),
    Accepted(
        "http",
        "bad/version_negative",
        "status",
        triton=404,
        naiad=400,
        reason="a version that is not a number is a malformed request (400), not an unknown one",
    ),
    Accepted(
        "http",
        "stats/unknown",
        "status",
        triton=400,
        naiad=404,
        reason="statistics of an unknown model: 404 like every other request naming one",
    ),
    Accepted(
        "grpc",
        "stats/unknown",
        "code",
        triton="INVALID_ARGUMENT",
        naiad="NOT_FOUND",
        reason="statistics of an unknown model: NOT_FOUND like every other request naming one",
    ),
    Accepted(
        "http",
        "bad/out_of_range",
        "*",
        reason="Triton wraps a JSON value out of the datatype's range (300 as INT8 is 44); Naiad "
        "refuses it (400): no silent wrap-around",
    ),
    Accepted(
        "grpc",
        "bad/raw_count_mismatch",
        "*",
        reason="Triton ignores `raw_input_contents` beyond the inputs; Naiad refuses a count that "
        "differs from the inputs' (INVALID_ARGUMENT)",
    ),
    Accepted(
        "http",
        "ens/one_output",
        "*",
        reason='Triton 2.51 fails an ensemble request that names only some outputs ("unexpected '
        'deadlock"); Naiad answers it',
    ),
    Accepted(
        "*",
        "ens/plain",
        "*.parameters",
        reason="Triton's ensemble scheduler copies `sequence_id`/`sequence_start`/`sequence_end` "
        "into its responses; Naiad sends no parameters it was not given",
    ),
    Accepted(
        "grpc",
        "stream/bad_requests",
        "response*.response.model_name",
        reason="a streamed request refused before it reaches a model: Naiad's error answer echoes its "
        "model name (and id); Triton's only the id",
    ),
    Accepted(
        "grpc",
        "stream/bad_requests",
        "response*.response.parameters",
        reason="Naiad flags every streamed answer `triton_final_response` (each is its request's last); "
        "Triton leaves the flag off requests it refuses before scheduling them",
    ),
    Accepted(
        "stats",
        "identity",
        "*.fail",
        reason="a request with no inputs: Triton counts it a failed request of the model; Naiad refuses it "
        "before it reaches the model, uncounted, as every malformed request",
    ),
    Accepted(
        "stats",
        "identity",
        "*.success",
        reason="classification of a BOOL output: Triton runs the model (a success) and then refuses it; "
        "Naiad refuses it before running it",
    ),
    Accepted(
        "stats",
        "failing",
        "*.success",
        reason="a response carrying a `TritonError`: Triton counts it a success, Naiad a failure (the "
        "client got an error)",
    ),
    Accepted(
        "stats",
        "failing",
        "*.fail",
        reason="a response carrying a `TritonError`: Triton counts it a success, Naiad a failure (the "
        "client got an error)",
    ),
    Accepted(
        "stats",
        "failing",
        "*.execution_count",
        reason="a batch whose `execute` raised: Triton counts an execution, Naiad counts executed "
        "batches only",
    ),
    Accepted(
        "http",
        "config/ens",
        "body.ensemble_scheduling.max_inflight_requests",
        reason="a field of the newer `model_config.proto` shipped in tritonclient, unknown to Triton 2.51's",
    ),
]

PENDING: list[Accepted] = []


def explained(transport: str, case: str, path: str, triton: Any, naiad: Any) -> Accepted | None:
    """The first row of :data:`ACCEPTED` or :data:`PENDING` that accepts this difference."""
    for row in ACCEPTED + PENDING:
        if row.matches(transport, case, path, triton, naiad):
            return row
    return None


def render_table() -> str:
    """:data:`ACCEPTED` as the Markdown table ``docs/protocol.md`` carries."""
    lines = ["| where (transport, case, field) | reason |", "| --- | --- |"]
    lines += [f"| {row.what()} | {row.reason} |" for row in ACCEPTED]
    return "\n".join(lines)
