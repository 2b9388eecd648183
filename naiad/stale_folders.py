"""Private socket folders left in the temporary directory by a process killed with SIGKILL.

A gateway's reply folder (:mod:`naiad.reply_channel`) and the control folder of a server's
gateway processes (:mod:`gateway.siblings`) are removed by their owner when it stops; a
process killed with SIGKILL removes nothing. The next process to make such a folder sweeps
those of its prefix that are stale: owned by this user, older than :data:`STALE_AFTER_S`
(their modification time: a socket made or removed in them touches it), and with no Unix
socket in them (``*.sock``) that accepts a connection.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time

#: Seconds after which a folder whose sockets no longer answer is stale (its owner was killed).
STALE_AFTER_S = 60.0


def remove_stale_folders(prefix: str, directory: str | None = None) -> None:
    """Remove the stale folders named ``prefix``* in ``directory`` (default: the temporary
    directory; module doc). Never raises: a folder it cannot read or remove stays."""
    directory = directory or tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            folder = os.path.join(directory, name)
            if name.startswith(prefix) and _stale(folder):
                shutil.rmtree(folder, ignore_errors=True)


def _stale(folder: str) -> bool:
    try:
        info = os.stat(folder)
        if time.time() - info.st_mtime < STALE_AFTER_S or info.st_uid != os.getuid():
            return False
        sockets = [name for name in os.listdir(folder) if name.endswith(".sock")]
    except OSError:
        return False
    return not any(_answers(os.path.join(folder, name)) for name in sockets)


def _answers(path: str) -> bool:
    """Whether the Unix socket ``path`` accepts a connection (or cannot be told: kept)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.1)
        try:
            probe.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            return False
        except OSError:
            return True
    return True
