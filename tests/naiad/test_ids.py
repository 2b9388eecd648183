"""``naiad.ids.fresh_id``: unique within a process, across processes and across a fork."""

from __future__ import annotations

import os
import subprocess
import sys

from naiad.ids import fresh_id


def test_ids_are_unique_in_a_process_and_share_its_prefix() -> None:
    ids = [fresh_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert {i[:16] for i in ids} == {ids[0][:16]} and all(int(i, 16) >= 0 for i in ids)


def test_another_process_and_a_forked_child_draw_their_own_prefix() -> None:
    other = subprocess.run([sys.executable, "-c", "from naiad.ids import fresh_id; print(fresh_id())"],
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its id and leave at once
        os.write(write, fresh_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    mine = fresh_id()
    assert len({mine[:16], other[:16], child[:16]}) == 3
