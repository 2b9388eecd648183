"""``python -m naiad.guard PARENT_PID LIFELINE_FD FOLDER PROGRAM [ARGS...]``: run PROGRAM so
that it dies with the ``naiad`` process that started it (:func:`naiad.procs.spawn_guarded`).

The guard is single-threaded, so it may set ``PR_SET_PDEATHSIG`` in PROGRAM between fork and
exec. It gets SIGTERM when its parent's thread dies and forwards SIGTERM/SIGINT to PROGRAM;
PROGRAM gets SIGKILL if the guard itself is killed. When PROGRAM has ended and the server is
gone, the guard removes FOLDER (if not empty string): the embedded Redis's private folder is
not left behind. "Gone": PARENT_PID is no longer its parent, or, after a signal, LIFELINE_FD
(the read end of a pipe only the server holds open) reads EOF within
:data:`PARENT_EXIT_WAIT_S`: the death signal comes when the server's *thread* that started the
guard exits, and while the killed server's other threads are still exiting the guard's parent
is still PARENT_PID; the pipe closes only with the whole process (or when the server stops the
guard on purpose: it closes the pipe first). PROGRAM ending on its own (a crash the server
restarts from the same folder) keeps the folder. It exits with PROGRAM's status (128 + the
signal number when a signal ended it). Standard library only; no work at import.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys

from naiad.procs import die_with_parent

#: Seconds the guard waits, after a signal, for the server's lifeline pipe to close.
PARENT_EXIT_WAIT_S = 0.5


def main(argv: list[str]) -> int:
    parent, lifeline, folder, program = int(argv[0]), int(argv[1]), argv[2], argv[3:]
    die_with_parent(signal.SIGTERM)
    child = subprocess.Popen(program, preexec_fn=lambda: die_with_parent(signal.SIGKILL))  # noqa: PLW1509
    signalled = []

    def forward(number: int, _frame: object) -> None:
        signalled.append(number)
        child.send_signal(number)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    if os.getppid() != parent:  # the parent died before the signal was asked for
        child.terminate()
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue
    if folder and _server_gone(parent, lifeline, bool(signalled)):
        shutil.rmtree(folder, ignore_errors=True)
    return code if code >= 0 else 128 - code


def _server_gone(parent: int, lifeline: int, signalled: bool) -> bool:
    """True when the server that started the guard has died or stopped it (module doc)."""
    if os.getppid() != parent:
        return True
    if not signalled:
        return False
    readable, _, _ = select.select([lifeline], [], [], PARENT_EXIT_WAIT_S)
    return bool(readable)  # the server never writes: readable means EOF


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
