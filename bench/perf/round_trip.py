"""What one crossing costs on this machine: the floor under Naiad's per-request CPU.

Three loops, each timed by CPU (``time.process_time``, this process; ``RUSAGE_CHILDREN`` for
the echo child) and wall clock, per round trip:

- ``socketpair``: 32 bytes to a forked echo process and back over a Unix socket, blocking
  calls: the kernel's price of two writes, two reads and two wake-ups (no event loop);
- ``redis-py``: ``HINCRBY`` through redis-py's asyncio client on uvloop to a private
  ``redis-server`` on a Unix socket (what each Redis round trip of the gateway or a worker
  goes through), with ``socket_timeout`` unset and set (Naiad's clients set it,
  :mod:`naiad.redis_client`; redis-py then wraps each write in ``asyncio.wait_for``).

Per request at c1 the gateway makes three Redis round trips (enqueue, reply read, statistics)
and one HTTP exchange, a worker one Redis round trip per batch (docs/benchmarks.md).

    .venv/bin/python -m bench.perf.round_trip --rounds 20000
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis.asyncio as aioredis

from naiad import eventloop
from naiad.redis_server import find_redis_server


def socketpair_round_trip(rounds: int) -> dict[str, float]:
    """µs per round trip: this process's CPU, the echo child's CPU, wall clock."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    pid = os.fork()
    if pid == 0:  # the echo child
        mine.close()
        for _ in range(rounds):
            theirs.sendall(theirs.recv(64))
        os._exit(0)
    theirs.close()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        mine.sendall(b"x" * 32)
        mine.recv(64)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    os.waitpid(pid, 0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    mine.close()
    return {"cpu_us": cpu / rounds * 1e6, "echo_cpu_us": child / rounds * 1e6, "wall_us": wall / rounds * 1e6}


async def redis_round_trip(socket_path: str, rounds: int, timeout_s: float | None) -> dict[str, float]:
    """µs per ``HINCRBY`` round trip through redis-py: this process's CPU, wall clock."""
    client = aioredis.from_url(f"unix://{socket_path}", socket_timeout=timeout_s)
    try:
        await client.ping()
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(rounds):
            await client.hincrby("bench", "n", 1)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        await client.aclose()
    return {"cpu_us": cpu / rounds * 1e6, "wall_us": wall / rounds * 1e6}


def row(loop: str, cpu_us: float, other_us: float | None, wall_us: float) -> None:
    other = "–" if other_us is None else f"{other_us:.1f}"
    print(f"| {loop} | {cpu_us:.1f} | {other} | {wall_us:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs of each loop")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "redis.sock")
        server = subprocess.Popen([find_redis_server(), "--port", "0", "--unixsocket", path, "--save", ""],
                                  stdout=subprocess.DEVNULL)  # fmt: skip
        try:
            while not os.path.exists(path):
                time.sleep(0.05)
            print("| loop | this process CPU µs | other side CPU µs | wall µs |\n| --- | --- | --- | --- |")
            for _ in range(args.repeat):
                pair = socketpair_round_trip(args.rounds)
                row("socketpair", pair["cpu_us"], pair["echo_cpu_us"], pair["wall_us"])
                for timeout in (None, 3.0):
                    got = eventloop.run(redis_round_trip(path, args.rounds, timeout))
                    row(f"redis-py HINCRBY, socket_timeout={timeout}", got["cpu_us"], None, got["wall_us"])
        finally:
            server.kill()
            server.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
