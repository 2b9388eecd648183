"""Workers that die before they can report: backoff, then the model is UNAVAILABLE.

A worker that fails its load in Python reports the reason itself
(:mod:`workers.load_failure`). One that dies first — a crash in a backend's native import,
``os._exit`` in a model file, the kernel's OOM killer — cannot. The scaler sees such a
worker exit with a status other than 0 (idle exit) or 2 (load failed, reported) before it
said it was ready (:func:`naiad.procs.became_ready`), and keeps a count here: each such exit
delays the model's next start by a backoff (:data:`BACKOFF_S`, doubled up to
:data:`MAX_BACKOFF_S`) instead of restarting it every tick; the :data:`THRESHOLD`-th in a row
tells the scaler to mark the model UNAVAILABLE with the reason (Triton's state for a model
whose load failed), so gateways refuse it at once, and the worker started next for its
backlog answers the waiting requests with that reason. A worker that reports ready clears
the count. Pure policy: no processes, no Redis.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

#: Early exits in a row after which the model is marked UNAVAILABLE.
THRESHOLD = 2
#: Seconds before a start after the first early exit; doubled per further one.
BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0


def describe_exit(returncode: int) -> str:
    """``code 3`` or ``signal SIGSEGV`` for a ``Popen.returncode``."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"code {returncode}"


def is_early_failure(returncode: int, ready: bool | None) -> bool:
    """True for a worker that exited abnormally before it reported ready."""
    return returncode not in (0, 2) and ready is False


@dataclass
class StartFailures:
    """Early exits per model, and when each model may be started again."""

    count: dict[str, int] = field(default_factory=dict)
    retry_at: dict[str, float] = field(default_factory=dict)

    def failed(self, model: str, now: float) -> bool:
        """Count one early exit of ``model`` at ``now`` (monotonic seconds); True when this
        one reaches :data:`THRESHOLD` (mark the model now)."""
        n = self.count[model] = self.count.get(model, 0) + 1
        self.retry_at[model] = now + min(BACKOFF_S * 2 ** (n - 1), MAX_BACKOFF_S)
        return n == THRESHOLD

    def marked(self, model: str) -> None:
        """The model is UNAVAILABLE now: its next start (for its backlog) need not wait."""
        self.retry_at.pop(model, None)

    def succeeded(self, model: str) -> None:
        self.count.pop(model, None)
        self.retry_at.pop(model, None)

    def may_start(self, model: str, now: float) -> bool:
        return now >= self.retry_at.get(model, 0.0)

    def reason(self, model: str, returncode: int) -> str:
        return (f"the worker of model '{model}' exited with {describe_exit(returncode)} before it "
                f"could serve, {self.count.get(model, 0)} times in a row (see the server log)")
