"""gateway.inflight: each gateway process's count in its own slot of one shared file, the
server's total read by any of them; and DataPlane.alone_in_server, which busy polling asks."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from naiad_harness import ROOT

from gateway import inflight
from gateway.inflight import SharedInflight


def test_processes_get_their_own_slots_and_each_reads_the_servers_total(tmp_path):
    first, second = SharedInflight(tmp_path), SharedInflight(tmp_path)
    assert first.slot != second.slot
    first.set(1)
    assert first.total() == second.total() == 1
    second.set(3)
    assert first.total() == 4
    second.close()  # a process that leaves counts nothing
    assert first.total() == 1
    first.close()


def test_another_processs_count_is_seen(tmp_path):
    """The file is mapped shared: another process's store is seen by this one's read."""
    here = SharedInflight(tmp_path)
    code = textwrap.dedent(f"""
        import pathlib, sys, time
        from gateway.inflight import SharedInflight
        there = SharedInflight(pathlib.Path({str(tmp_path)!r}))
        there.set(2)
        print(there.slot, flush=True)
        sys.stdin.readline()  # holds its count until told
        there.close()
    """)
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        slot = int(child.stdout.readline())
        assert slot != here.slot
        here.set(1)
        assert here.total() == 3
    finally:
        child.communicate("\n", timeout=30)
    assert here.total() == 1  # it closed its slot
    here.close()


def test_no_free_slot_raises(tmp_path, monkeypatch):
    monkeypatch.setattr(inflight, "SLOTS", 2)
    kept = [SharedInflight(tmp_path), SharedInflight(tmp_path)]
    with pytest.raises(OSError, match="no free slot"):
        SharedInflight(tmp_path)
    for shared in kept:
        shared.close()


def test_the_server_carries_one_request_alone_only_when_every_process_says_so(tmp_path):
    """DataPlane's admission writes its process's count to its slot; alone_in_server reads
    the server's: a second request in a sibling process ends it; a process with siblings
    whose counts it cannot read never counts as alone; one without siblings reads its own."""
    from types import SimpleNamespace

    from gateway.dataplane import DataPlane, _Admission

    here, there = SharedInflight(tmp_path), SharedInflight(tmp_path)
    plane = SimpleNamespace(_inflight=0, shared_inflight=here, siblings=object())
    with _Admission(plane):
        assert here.total() == 1 and DataPlane.alone_in_server(plane)
        there.set(1)  # the sibling admitted one
        assert not DataPlane.alone_in_server(plane)
        there.set(0)
        with _Admission(plane):
            assert here.total() == 2 and not DataPlane.alone_in_server(plane)
    assert here.total() == 0
    blind = SimpleNamespace(_inflight=1, shared_inflight=None, siblings=object())
    assert not DataPlane.alone_in_server(blind)
    single = SimpleNamespace(_inflight=1, shared_inflight=None, siblings=None)
    assert DataPlane.alone_in_server(single)
    here.close()
    there.close()
