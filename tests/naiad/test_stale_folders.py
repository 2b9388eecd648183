"""Socket folders of killed processes are swept by the next process that makes one."""

from __future__ import annotations

import os
import socket
import tempfile

import pytest

from gateway import siblings
from naiad.stale_folders import remove_stale_folders


@pytest.fixture
def folder(tmp_path):
    """``folder(name, live=[...], dead=[...], old=True)``: a folder with Unix sockets that
    accept connections (``live``) and socket files whose listener closed (``dead``: a
    killed owner's), its modification time an hour ago unless ``old`` is False."""
    listeners: list[socket.socket] = []

    def make(name, *, live=(), dead=(), old=True):
        path = tmp_path / name
        path.mkdir()
        for sock in (*live, *dead):
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(path / sock))
            listener.listen()
            listeners.append(listener)
            if sock in dead:
                listener.close()  # the file stays and refuses connections
        if old:
            os.utime(path, (1, 1))
        return path

    yield make
    for listener in listeners:
        listener.close()


def test_only_old_folders_of_the_prefix_whose_sockets_do_not_answer_go(tmp_path, folder):
    live = folder("naiad-x-live", live=["1.sock", "2.sock"])
    half = folder("naiad-x-half", live=["1.sock"], dead=["2.sock"])  # one socket still answers
    dead = folder("naiad-x-dead", dead=["1.sock"])
    empty = folder("naiad-x-empty")
    young = folder("naiad-x-young", dead=["1.sock"], old=False)
    other = folder("other-dead")
    remove_stale_folders("naiad-x-", str(tmp_path))
    assert live.exists() and half.exists() and young.exists() and other.exists()
    assert not dead.exists() and not empty.exists()


def test_a_new_control_folder_sweeps_those_of_killed_servers(tmp_path, monkeypatch, folder):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    killed = folder(siblings.FOLDER_PREFIX + "killed", dead=["41.sock"])
    made = siblings.control_folder()
    assert made.parent == tmp_path and made.name.startswith(siblings.FOLDER_PREFIX)
    assert made.exists() and not killed.exists()
    assert os.stat(made).st_mode & 0o777 == 0o700
