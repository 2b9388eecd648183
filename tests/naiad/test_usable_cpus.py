"""naiad.host.usable_cpus and gateway.siblings.process_count: how many gateway processes the
default (``--gateway-processes 0``) starts, from the CPUs a process may use: its affinity and
its cgroup's ``cpu.max`` (a fake cgroup folder here; this machine's cgroup is v1)."""

from __future__ import annotations

import errno
import os
import socket

import pytest

from gateway import siblings
from naiad.host import usable_cpus
from naiad.settings import Settings

AFFINITY = len(os.sched_getaffinity(0))


def cgroup(tmp_path, cpu_max: str | None, path: str = "/kubepods/pod1") -> tuple[str, str]:
    """A cgroup v2 root with ``cpu.max`` in this process's folder, and its /proc/self/cgroup."""
    folder = tmp_path / "cgroup" / path.lstrip("/")
    folder.mkdir(parents=True)
    if cpu_max is not None:
        (folder / "cpu.max").write_text(cpu_max + "\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text(f"1:cpu:/\n0::{path}\n")
    return str(tmp_path / "cgroup"), str(proc)


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("max 100000", AFFINITY),  # no limit
        ("100000 100000", 1),  # one CPU
        ("150000 100000", 1),  # 1.5 CPUs: whole CPUs, rounded down
        ("50000 100000", 1),  # half a CPU: still one
        ("6400000 100000", AFFINITY),  # a limit above the machine's CPUs
        (None, AFFINITY),  # no cpu.max: no limit
        ("garbage", AFFINITY),  # unreadable: no limit
        ("100000 0", AFFINITY),
    ],
)
def test_the_cgroup_limit_narrows_the_affinity(tmp_path, cpu_max, expected):
    root, proc = cgroup(tmp_path, cpu_max)
    assert usable_cpus(root, proc) == min(expected, AFFINITY)


def test_a_limit_at_the_cgroup_root_counts_when_the_own_folder_has_none(tmp_path):
    root, proc = cgroup(tmp_path, None)
    (tmp_path / "cgroup" / "cpu.max").write_text("100000 100000\n")  # a container's namespace root
    assert usable_cpus(root, proc) == 1


def test_a_limit_on_a_parent_cgroup_counts_under_an_unlimited_own_one(tmp_path):
    root, proc = cgroup(tmp_path, "max 100000", path="/kubepods/pod1/ctr")
    (tmp_path / "cgroup" / "kubepods" / "pod1" / "cpu.max").write_text("100000 100000\n")
    assert usable_cpus(root, proc) == 1


@pytest.mark.parametrize(("quota", "expected"), [("100000", 1), ("-1", AFFINITY), ("x", AFFINITY)])
def test_a_cgroup_v1_cfs_quota_counts(tmp_path, quota, expected):
    folder = tmp_path / "cgroup" / "cpu,cpuacct" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text(quota + "\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    assert usable_cpus(str(tmp_path / "cgroup"), str(proc)) == min(expected, AFFINITY)


def test_a_pinned_process_counts_its_cpus(tmp_path):
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        assert usable_cpus(str(tmp_path / "none"), str(tmp_path / "none")) == 1
    finally:
        os.sched_setaffinity(0, before)


def test_the_default_starts_one_gateway_process_a_cpu_at_most_auto_most(monkeypatch):
    assert Settings().gateway_processes == 0  # the default: decided by the machine
    for cpus, expected in ((1, 1), (2, 2), (64, siblings.AUTO_MOST)):
        monkeypatch.setattr(siblings.host, "usable_cpus", lambda cpus=cpus: cpus)
        assert siblings.process_count(Settings()) == min(expected, siblings.AUTO_MOST)
        assert siblings.process_count(Settings(gateway_processes=3)) == 3  # asked for: as asked
        # an ephemeral port would be another one in each process: one process
        assert siblings.process_count(Settings(http_port=0)) == 1
        assert siblings.process_count(Settings(grpc_port=0)) == 1


def test_each_process_holds_its_share_of_the_servers_limits():
    mib = 1024**2
    limits = {"max_inflight": 4096, "http_max_connections": 5, "max_buffered_bytes": 256 * mib}
    one = Settings(gateway_processes=1, **limits)
    assert siblings.per_process(one) == one  # one process: the limits as given
    assert siblings.per_process(Settings(http_port=0)).gateway_processes == 1  # the default resolved
    two = siblings.per_process(Settings(gateway_processes=2, **limits))
    assert (two.gateway_processes, two.max_inflight, two.http_max_connections) == (2, 2048, 2)
    assert two.max_buffered_bytes == 128 * mib
    many = siblings.per_process(Settings(gateway_processes=8, max_inflight=3, http_max_connections=1,
                                         max_buffered_bytes=100 * mib))  # fmt: skip
    assert (many.max_inflight, many.http_max_connections) == (1, 1)  # at least one each
    assert many.max_buffered_bytes == 64 * mib  # at least the largest request (64 MiB by default)


def test_a_port_something_listens_on_is_not_free():
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as a gateway binds it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError) as refused:
            siblings.check_ports_free("127.0.0.1", [port])
        assert refused.value.errno == errno.EADDRINUSE
    siblings.check_ports_free("127.0.0.1", [port])  # closed: free again
