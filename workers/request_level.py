"""Running a dynamic batch on a request-level backend (Triton's Python backend).

Such a backend takes the batch's requests as they are (``execute_requests``, see
:class:`workers.backends.Backend`) instead of one merged array per input, and answers each
request on its own: outputs, or the error that fails that request alone. The worker's
statistics and Triton's three compute phases are kept as for a merged batch:
compute_input (nothing to merge: 0), compute_infer (the backend, in a thread),
compute_output (encoding the replies).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from naiad import stats, tracing
from naiad.codec import QueuedRequest, Reply, encode_reply
from naiad.errors import NaiadError
from workers import batching
from workers.model import ModelRunner


def is_request_level(runner: ModelRunner) -> bool:
    """True when ``runner``'s backend answers requests one by one (``execute_requests``)."""
    return callable(getattr(runner.backend, "execute_requests", None))


async def run_requests(
    runner: ModelRunner, group: Sequence[QueuedRequest]
) -> tuple[list[bytes], stats.Execution]:
    """Run ``group`` (one batch, one version) through the backend's ``execute_requests``:
    the encoded replies in ``group`` order and the batch's statistics. Raises what the
    backend raises when the whole batch fails (the worker answers every request with it)."""
    requests = [queued.request for queued in group]
    batched = runner.config.max_batch_size > 0
    rows = sum(batching.rows(r) if batched else 1 for r in requests)
    started_s, t1 = time.time(), time.perf_counter_ns()
    with tracing.span("naiad.backend", {"naiad.batch_rows": rows, "naiad.batch_requests": len(group)}):
        results = await asyncio.to_thread(runner.backend.execute_requests, requests)  # type: ignore[attr-defined]
    t2 = time.perf_counter_ns()
    phases = {"compute_input": 0, "compute_infer": t2 - t1}
    payloads = [
        encode_reply(Reply(q.queue_id, error=result) if isinstance(result, NaiadError)
                     else Reply(q.queue_id, result, timings_ns=dict(phases)))
        for q, result in zip(group, results, strict=True)
    ]  # fmt: skip
    phases["compute_output"] = time.perf_counter_ns() - t2
    queue_ns = [max(0, int((started_s - q.enqueued_at) * 1e9)) for q in group]
    return payloads, stats.Execution(requests[0].version, rows, queue_ns, phases, int(time.time() * 1000))
