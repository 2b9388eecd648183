"""``python -m naiad.guard PARENT_PID FOLDER PROGRAM [ARGS...]``: run PROGRAM so that it dies
with the ``naiad`` process that started it (:func:`naiad.procs.spawn_guarded`).

The guard is single-threaded, so it may set ``PR_SET_PDEATHSIG`` in PROGRAM between fork and
exec. It gets SIGTERM when its parent's thread dies and forwards SIGTERM/SIGINT to PROGRAM;
PROGRAM gets SIGKILL if the guard itself is killed. When PROGRAM has ended and PARENT_PID is
no longer its parent (the server died), the guard removes FOLDER (if not empty string): the
embedded Redis's private folder is not left behind. It exits with PROGRAM's status (128 + the
signal number when a signal ended it). Standard library only; no work at import.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

from naiad.procs import die_with_parent


def main(argv: list[str]) -> int:
    parent, folder, program = int(argv[0]), argv[1], argv[2:]
    die_with_parent(signal.SIGTERM)
    child = subprocess.Popen(program, preexec_fn=lambda: die_with_parent(signal.SIGKILL))  # noqa: PLW1509
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    if os.getppid() != parent:  # the parent died before the signal was asked for
        child.terminate()
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue
    if folder and os.getppid() != parent:
        shutil.rmtree(folder, ignore_errors=True)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
