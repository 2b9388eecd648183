"""The measuring half of the front probes (:mod:`bench.perf.http_front`, :mod:`bench.perf.grpc_front`).

Each server of a probe is a function serving on a listening socket it is given (bound here on
a free loopback port, ``SO_REUSEPORT`` so a server may bind the port itself, as grpc does),
run in a process of its own; :func:`measure` loads it with :mod:`bench.perf.loadgen` (closed
loop) and reads that process's CPU; :func:`main` alternates the servers ``--rounds`` times
so a drifting machine hits all alike, and prints medians as a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import statistics
import time
from collections.abc import Callable

import psutil

from bench.perf import loadgen
from bench.perf.models import target

Serve = Callable[[socket.socket], None]


def measure(serve: Serve, protocol: str, concurrency: int, warmup_s: float, duration_s: float) -> dict:
    """One load point of ``serve`` (the digits request, JSON over HTTP or gRPC): the
    load generator's point plus ``server_us_per_request`` (user + system CPU of the server
    process over the measured window, µs per answered request)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    process = multiprocessing.get_context("spawn").Process(target=serve, args=(sock,))
    process.start()
    sock.close()  # the child has its own copy
    try:
        server = psutil.Process(process.pid)
        tgt = target(f"127.0.0.1:{port}", "digits", protocol=protocol, encoding="json")
        return loadgen.run(lambda: _load(tgt, server, concurrency, warmup_s, duration_s))
    finally:
        process.kill()
        process.join()


async def _load(tgt, server: psutil.Process, concurrency: int, warmup_s: float, duration_s: float) -> dict:
    client = loadgen.make_client(tgt)
    for _ in range(100):  # the server process is starting
        try:
            await client.send()
            break
        except (OSError, loadgen.RequestError):
            await asyncio.sleep(0.1)
    await loadgen.closed_loop(client.send, concurrency, warmup_s, 0.2)
    before, started = server.cpu_times(), time.perf_counter()
    point = await loadgen.closed_loop(client.send, concurrency, 0.0, duration_s)
    after, wall = server.cpu_times(), time.perf_counter() - started
    await client.close()
    cpu = (after.user + after.system) - (before.user + before.system)
    point["server_us_per_request"] = 1e6 * cpu / max(point["throughput_rps"] * wall, 1)
    return point


def main(servers: dict[str, Serve], protocol: str, description: str) -> None:
    """Parse ``--concurrency --warmup --duration --rounds``, measure every server of
    ``servers`` at each concurrency each round, print the medians."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.rounds):
        for concurrency in args.concurrency:
            for name, serve in servers.items():
                point = measure(serve, protocol, concurrency, args.warmup, args.duration)
                results.setdefault((name, concurrency), []).append(point)
    print("| server | load | req/s | p50 ms | server CPU µs/req | errors |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (name, concurrency), points in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rps = statistics.median(p["throughput_rps"] for p in points)
        p50 = statistics.median(p["latency_ms"]["p50"] for p in points)
        cpu = statistics.median(p["server_us_per_request"] for p in points)
        errors = sum(p["errors"] for p in points)
        print(f"| {name} | c{concurrency} | {rps:.0f} | {p50:.2f} | {cpu:.0f} | {errors} |")
