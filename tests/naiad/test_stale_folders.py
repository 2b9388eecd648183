"""Socket folders of killed processes are swept by the next process that makes one."""

from __future__ import annotations

import os
import socket
import tempfile

from gateway import siblings
from naiad.stale_folders import remove_stale_folders


def _folder(root, name, *, old=True, sockets=()):
    folder = root / name
    folder.mkdir()
    for sock in sockets:
        sock_path = str(folder / sock)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(sock_path)
        server.listen()
        _LISTENING.append(server)
    if old:
        os.utime(folder, (1, 1))
    return folder


_LISTENING: list[socket.socket] = []


def _close_last() -> None:
    """Close the last listener: its socket file stays and refuses connections (a killed owner)."""
    _LISTENING.pop().close()


def test_only_old_folders_of_the_prefix_whose_sockets_do_not_answer_go(tmp_path):
    try:
        live = _folder(tmp_path, "naiad-x-live", sockets=["1.sock", "2.sock"])
        half = _folder(tmp_path, "naiad-x-half", sockets=["1.sock", "2.sock"])
        _close_last()  # one of its two sockets still answers: kept
        dead = _folder(tmp_path, "naiad-x-dead", sockets=["1.sock"])
        _close_last()
        empty = _folder(tmp_path, "naiad-x-empty")
        young = _folder(tmp_path, "naiad-x-young", old=False, sockets=["1.sock"])
        _close_last()
        other = _folder(tmp_path, "other-dead")
        remove_stale_folders("naiad-x-", str(tmp_path))
        assert live.exists() and half.exists() and young.exists() and other.exists()
        assert not dead.exists() and not empty.exists()
    finally:
        while _LISTENING:
            _close_last()


def test_a_new_control_folder_sweeps_those_of_killed_servers(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    killed = _folder(tmp_path, siblings.FOLDER_PREFIX + "killed", sockets=["41.sock"])
    _close_last()
    made = siblings.control_folder()
    assert made.parent == tmp_path and made.name.startswith(siblings.FOLDER_PREFIX)
    assert made.exists() and not killed.exists()
    assert os.stat(made).st_mode & 0o777 == 0o700
