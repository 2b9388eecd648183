"""What one request costs a server, read around a measured window: CPU per process kind,
Redis commands and round trips, and the batches the server formed.

A :class:`Costs` takes a snapshot at the window's start and its end; :meth:`Costs.report`
turns the two into per-request figures, given the requests completed in between:

- ``cpu_us_per_request``: CPU µs (user + system) per completed request, per process kind of
  the server's tree (:func:`kind_of`): ``server`` (the root: Naiad's gateway with its scaler,
  and its sibling gateway processes, ``--gateway-processes``; ``tritonserver``, ...),
  ``redis-server``, ``worker`` (``naiad worker`` processes),
  ``python stub`` (Triton's Python-backend stub), ``other``;
- ``redis``: for a tree with a ``redis-server``, commands and *read events* per request
  (``INFO stats``: ``total_commands_processed``, and ``total_reads_processed``, one per
  socket read that found a client's data, Redis ≥ 6: a pipeline sent at once is one read,
  so this counts round trips), less the snapshots' own ``INFO`` (one persistent connection);
- ``batches``: from the statistics extension (``GET /v2/models/{m}/stats``, Triton's
  ``batch_stats``: one entry per batch size, ``compute_infer.count`` batches of that size),
  the batches executed in the window by size and their mean, for any v2 server.

Every reading is best effort: a figure that cannot be read is left out, never an error.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

KINDS = ("server", "redis-server", "worker", "python stub", "other")
#: Commands (and reads) of a snapshot's own that land between two snapshots: the first
#: one's two INFO calls (stats, commandstats).
INFO_CALLS = 1


def kind_of(process: psutil.Process, root_pid: int) -> str:
    """The process kind of one member of a server's tree (see the module docstring)."""
    if process.pid == root_pid:
        return "server"
    try:
        name, args = process.name(), " ".join(process.cmdline()).split()
    except psutil.Error:
        return "other"
    if name.startswith("redis-server"):
        return "redis-server"
    if "triton_python_backend_stub" in name or any("triton_python_backend_stub" in a for a in args[:1]):
        return "python stub"
    if "worker" in args and any("naiad" in a for a in args):
        return "worker"
    if "gateway" in args and any("naiad" in a for a in args):  # --gateway-processes' siblings
        return "server"
    return "other"


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_by_kind(pids: list[int]) -> dict[str, float]:
    """CPU seconds so far of every live process of the trees under ``pids``, by kind."""
    seconds: dict[str, float] = {}
    for pid in pids:
        for process in tree(pid):
            try:
                t = process.cpu_times()
            except psutil.Error:
                continue
            kind = kind_of(process, pid)
            seconds[kind] = seconds.get(kind, 0.0) + t.user + t.system
    return seconds


def redis_address(process: psutil.Process) -> tuple[str | None, str | None]:
    """``(unix socket path, password)`` of a ``redis-server`` (which retitles itself, so its
    command line says neither): the unix socket it listens on, and a ``requirepass`` from a
    ``*.conf`` file beside that socket (where Naiad's embedded Redis keeps its config)."""
    try:
        sockets = [c.laddr for c in process.net_connections(kind="unix") if c.laddr]
    except psutil.Error:
        return None, None
    if not sockets:
        return None, None
    socket, password = sockets[0], None
    for config in Path(socket).parent.glob("*.conf"):
        try:
            lines = config.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "requirepass":
                password = value.strip().strip('"')
    return socket, password


def redis_client(pids: list[int]):
    """A client of the first ``redis-server`` (on a unix socket) in the trees under
    ``pids``, connected; None without one."""
    import redis  # noqa: PLC0415 - the bench's own dependency, only where a tree has Redis

    for pid in pids:
        for process in tree(pid):
            if kind_of(process, pid) != "redis-server":
                continue
            socket, password = redis_address(process)
            if not socket:
                continue
            client = redis.Redis(unix_socket_path=socket, password=password, socket_timeout=2)
            try:
                client.ping()
            except redis.RedisError:
                continue
            return client
    return None


def redis_counters(client) -> dict[str, int] | None:
    """``{"commands", "reads"}`` so far (``INFO stats``), None if unreadable."""
    import redis  # noqa: PLC0415

    try:
        stats, commands = client.info("stats"), client.info("commandstats")
    except redis.RedisError:
        return None
    calls = {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in commands.items()}
    return {"commands": int(stats["total_commands_processed"]),
            "reads": int(stats.get("total_reads_processed", 0)), "calls": calls}  # fmt: skip


def batch_counts(stats_url: str | None, model: str) -> dict[int, int] | None:
    """Batches executed so far by batch size (statistics extension), None if unreadable."""
    if not stats_url:
        return None
    try:
        with urllib.request.urlopen(f"http://{stats_url}/v2/models/{model}/stats", timeout=5) as answer:
            body = json.loads(answer.read())
        counts: dict[int, int] = {}
        for stat in body["model_stats"]:
            for batch in stat.get("batch_stats", []):
                size = int(batch["batch_size"])
                counts[size] = counts.get(size, 0) + int(batch["compute_infer"]["count"])
        return counts
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass
class Snapshot:
    cpu: dict[str, float] = field(default_factory=dict)
    redis: dict[str, int] | None = None
    batches: dict[int, int] | None = None


@dataclass
class Costs:
    """The cost readings of one server: its process ids, and where its statistics are
    (``host:port`` of its HTTP endpoint, the model measured)."""

    pids: list[int]
    stats_url: str | None = None
    model: str = ""
    _redis: object = None

    def snapshot(self, start: bool) -> Snapshot:
        """The readings now. The statistics call costs the server Redis commands, so it comes
        before the Redis reading at the window's ``start`` and after it at its end."""
        if self._redis is None:
            self._redis = redis_client(self.pids) or False
        batches = batch_counts(self.stats_url, self.model) if start else None
        snap = Snapshot(cpu_by_kind(self.pids), redis_counters(self._redis) if self._redis else None, batches)
        if not start:
            snap.batches = batch_counts(self.stats_url, self.model)
        return snap

    def report(self, before: Snapshot, after: Snapshot, requests: int) -> dict:
        """Per-request figures between two snapshots (module docstring); {} for no requests."""
        if requests <= 0:
            return {}
        out: dict = {"cpu_us_per_request": {
            kind: round((after.cpu.get(kind, 0.0) - before.cpu.get(kind, 0.0)) * 1e6 / requests, 1)
            for kind in KINDS if kind in after.cpu
        }}  # fmt: skip
        if before.redis and after.redis:
            out["redis"] = {}
            for name in ("commands", "reads"):
                spent = after.redis[name] - before.redis[name] - INFO_CALLS * 2
                out["redis"][f"{name}_per_request"] = round(spent / requests, 2)
            calls = {name: n - before.redis["calls"].get(name, 0) for name, n in after.redis["calls"].items()}
            calls["info"] = calls.get("info", 0) - INFO_CALLS * 2
            out["redis"]["calls_per_request"] = {
                name: round(n / requests, 2)
                for name, n in sorted(calls.items(), key=lambda kv: -kv[1])
                if n > 0
            }
        if before.batches is not None and after.batches is not None:
            sizes = {s: after.batches.get(s, 0) - before.batches.get(s, 0) for s in after.batches}
            sizes = {s: n for s, n in sorted(sizes.items()) if n > 0}
            executed = sum(sizes.values())
            mean = sum(s * n for s, n in sizes.items()) / executed if executed else None
            out["batches"] = {"executed": executed, "mean_size": round(mean, 2) if mean else None,
                              "by_size": {str(s): n for s, n in sizes.items()}}  # fmt: skip
        return out
