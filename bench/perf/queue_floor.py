"""The queue's own floor: one request's round trip through Redis with no HTTP, no model, and
next to no Python around it, on this machine.

A "gateway" process ``XADD``s an entry and waits for its reply with ``BLPOP``; a "worker"
process claims it with ``XREADGROUP BLOCK`` and answers with ``RPUSH`` + ``XACK`` in one
pipeline: the two hops (gateway → Redis → worker, worker → Redis → gateway) of Naiad's
request path before stop 17, one request at a time, redis-py's asyncio client with hiredis,
uvloop, a private ``redis-server`` (:class:`naiad.redis_server.EmbeddedRedis`). Prints the
p50 / p90 round trip (ms) and the gateway process's CPU a request (µs). Compare with Naiad's
and Triton's c1 p50 in docs/benchmarks.md ("Stop 17").

    .venv/bin/python -m bench.perf.queue_floor --requests 3000
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

import redis.asyncio as aioredis

from naiad import eventloop
from naiad.redis_server import EmbeddedRedis


async def _worker(url: str) -> None:
    redis = aioredis.from_url(url)
    while True:
        found = await redis.xreadgroup("g", "w", {"s": ">"}, count=32, block=1000)
        for _, entries in found or []:
            async with redis.pipeline(transaction=False) as pipe:
                for _, fields in entries:
                    pipe.rpush(b"reply:" + fields[b"id"], b"x" * 100)
                pipe.xack("s", "g", *[entry_id for entry_id, _ in entries])
                await pipe.execute()


def _serve(url: str) -> None:
    eventloop.run(_worker(url))


async def _gateway(url: str, requests: int) -> tuple[list[float], float]:
    redis = aioredis.from_url(url)
    await redis.xgroup_create("s", "g", id="0", mkstream=True)
    latencies, cpu = [], time.process_time()
    for i in range(requests):
        started = time.perf_counter()
        await redis.xadd("s", {"id": str(i), "d": b"y" * 300})
        await redis.blpop([f"reply:{i}"], timeout=2)
        latencies.append(time.perf_counter() - started)
    cpu = time.process_time() - cpu
    await redis.aclose()
    return latencies, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args(argv)
    server = EmbeddedRedis()
    server.start()
    worker = multiprocessing.get_context("spawn").Process(target=_serve, args=(server.url,), daemon=True)
    try:
        worker.start()
        latencies, cpu = eventloop.run(_gateway(server.url, args.requests))
    finally:
        worker.terminate()
        server.stop()
    latencies = sorted(latencies[len(latencies) // 10 :])  # the first tenth warms up
    p50, p90 = (latencies[int(len(latencies) * q)] * 1e3 for q in (0.5, 0.9))
    per_request = cpu / args.requests * 1e6
    print(f"queue round trip: p50 {p50:.3f} ms, p90 {p90:.3f} ms; gateway CPU {per_request:.0f} µs a request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
