"""Soak: a steady request rate against a real ``naiad serve`` while all its workers are
SIGKILLed every ``--kill-every-s`` and Redis is killed and restarted once. Counts what happened to
every request and prints one JSON object.

It starts its own Redis (:class:`naiad.redis_server.EmbeddedRedis` on a fixed unix socket,
AOF with ``appendfsync always`` unless ``--no-appendonly``, so a restart keeps the queues,
consumer groups and reply lists) and ``naiad serve --redis-url`` on free ports with the
example repository (built into a temp folder unless ``--repository``). The load is
open-loop: request ``n`` is sent at ``n / rate`` seconds whatever the earlier ones do, each
carrying its own id and 1-4 held-out digits; the answer is compared with onnxruntime run on
the served file. Outcomes:

- ``answered``: 200, right labels, the response echoes the request's id;
- ``wrong``: 200 with other labels or another id; ``duplicated``: a second answer for an id;
- ``failed``: any other status or a transport error, by reason (``failed_during_outage``:
  those that ended while Redis was down or within ``--outage-grace-s`` of its return);
- ``lost``: sent but never finished by the end of the drain (``--drain-s``).

    .venv/bin/python bench/soak.py [--duration-s 210] [--rate 40] [--kill-every-s 20] ...

Exit status 1 when anything was lost, duplicated or wrong, or a failure fell outside the
outage.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import onnxruntime as ort
import psutil
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from naiad.redis_server import EmbeddedRedis  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=210.0, help="seconds of load")
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second")
    parser.add_argument("--kill-every-s", type=float, default=20.0, help="SIGKILL every worker this often")
    parser.add_argument("--redis-restart-at-s", type=float, default=None,
                        help="when Redis is killed (default: half-way; negative: never)")
    parser.add_argument("--redis-down-s", type=float, default=2.0, help="seconds Redis stays down")
    parser.add_argument("--no-appendonly", action="store_true", help="Redis without persistence")
    parser.add_argument("--outage-grace-s", type=float, default=3.0,
                        help="failures this long after Redis is back still count as the outage's")
    parser.add_argument("--request-timeout-s", type=float, default=30.0, help="each request's timeout")
    parser.add_argument("--drain-s", type=float, default=40.0, help="wait for in-flight requests at the end")
    parser.add_argument("--repository", type=Path, help="a built example repository (default: build one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, help="keep logs here (default: a temp folder)")
    return parser.parse_args(argv)


class Tally:
    """What happened to every request, by id."""

    def __init__(self) -> None:
        self.sent = 0
        self.answers: collections.Counter[str] = collections.Counter()
        self.wrong: list[str] = []
        self.failed: collections.Counter[str] = collections.Counter()
        self.failed_during_outage: collections.Counter[str] = collections.Counter()
        self.latencies_s: list[float] = []
        self.outage: tuple[float, float] | None = None  # (down at, back at) monotonic
        self.events: list[str] = []

    def in_outage(self, now: float, grace_s: float) -> bool:
        if self.outage is None:
            return False
        down, back = self.outage
        return down <= now <= (back if back else float("inf")) + grace_s

    def summary(self, lost: int) -> dict:
        lat = sorted(self.latencies_s)

        def pct(q: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 1) if lat else None

        return {
            "sent": self.sent,
            "answered": sum(1 for n in self.answers.values() if n >= 1) - len(self.wrong),
            "wrong": len(self.wrong),
            "duplicated": sum(1 for n in self.answers.values() if n > 1),
            "failed": dict(self.failed),
            "failed_during_outage": dict(self.failed_during_outage),
            "lost": lost,
            "latency_ms": {"p50": pct(0.5), "p99": pct(0.99), "max": pct(1.0)},
            "events": self.events,
        }


class Soak:
    def __init__(self, args: argparse.Namespace, workdir: Path, repository: Path):
        self.args = args
        self.workdir = workdir
        self.repository = repository
        self.rng = random.Random(args.seed)
        self.tally = Tally()
        self.redis = EmbeddedRedis(socket_path=workdir / "redis" / "redis.sock",
                                   appendonly=not args.no_appendonly, appendfsync="always")  # fmt: skip
        self.server: subprocess.Popen | None = None
        self.http_port = free_port()
        self.started = 0.0

    def log(self, text: str) -> None:
        line = f"{time.monotonic() - self.started:7.1f} s  {text}"
        self.tally.events.append(line)
        print(line, file=sys.stderr, flush=True)

    def start(self) -> None:
        (self.workdir / "redis").mkdir(parents=True, exist_ok=True)
        self.redis.start()
        args = [
            sys.executable, "-m", "naiad_cli", "serve", "--model-repository", str(self.repository),
            "--redis-url", self.redis.url, "--http-port", str(self.http_port),
            "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
            "--idle-timeout", "60", "--cache-dir", str(self.workdir / "cache"),
            "--request-timeout", str(self.args.request_timeout_s), "--shutdown-grace", "5",
        ]  # fmt: skip
        with (self.workdir / "serve.log").open("wb") as log:
            self.server = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                           env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(requests.ConnectionError):
                if requests.get(f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=2).ok:
                    return
            if self.server.poll() is not None:
                raise SystemExit(f"naiad serve exited: {(self.workdir / 'serve.log').read_text()[-3000:]}")
            time.sleep(0.1)
        raise SystemExit("naiad serve did not become ready")

    def stop(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGINT)
            try:
                self.server.wait(30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
        self.redis.stop()

    def workers(self) -> list[psutil.Process]:
        assert self.server is not None
        found = []
        for child in psutil.Process(self.server.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                cmd = " ".join(child.cmdline()).split()  # a claimed pool process's title is one string
                if "worker" in cmd and child.status() != psutil.STATUS_ZOMBIE:
                    found.append(child)
        return found

    async def chaos(self) -> None:
        """SIGKILL every worker process (serving or warm-pool: a claimed pool process is
        retitled ``naiad worker --model M ...``) every ``kill_every_s``; kill Redis once, start it again."""
        restart_at = self.args.redis_restart_at_s
        restart_at = self.args.duration_s / 2 if restart_at is None else restart_at
        next_kill = self.args.kill_every_s
        restarted = restart_at < 0
        while (now := time.monotonic() - self.started) < self.args.duration_s:
            if not restarted and now >= restart_at:
                restarted = True
                self.redis.kill()
                self.tally.outage = (time.monotonic(), 0.0)
                self.log("redis killed (SIGKILL)")
                await asyncio.sleep(self.args.redis_down_s)
                await asyncio.to_thread(self.redis.start)
                self.tally.outage = (self.tally.outage[0], time.monotonic())
                self.log("redis started again")
            if now >= next_kill:
                next_kill += self.args.kill_every_s
                victims = self.workers()
                for victim in victims:
                    with contextlib.suppress(psutil.Error):
                        victim.kill()
                self.log(f"SIGKILL every worker process: pids {[v.pid for v in victims]}")
            await asyncio.sleep(0.1)

    async def one(self, session: aiohttp.ClientSession, n: int, x: np.ndarray, expected: np.ndarray) -> None:
        request_id = f"soak-{n}"
        body = {"id": request_id, "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                              "data": x.flatten().tolist()}],
                "outputs": [{"name": "label"}]}  # fmt: skip
        sent = time.monotonic()
        reason = None
        try:
            async with session.post(f"http://127.0.0.1:{self.http_port}/v2/models/digits/infer",
                                    json=body) as response:  # fmt: skip
                payload = await response.json(content_type=None)
                if response.status != 200:
                    reason = f"{response.status} {_kind(payload.get('error', ''))}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = f"transport {type(exc).__name__}"
        done = time.monotonic()
        if reason is not None:
            target = (self.tally.failed_during_outage if self.tally.in_outage(done, self.args.outage_grace_s)
                      else self.tally.failed)  # fmt: skip
            target[reason] += 1
            return
        self.tally.latencies_s.append(done - sent)
        answer_id = payload.get("id")
        self.tally.answers[answer_id] += 1
        labels = next((o["data"] for o in payload["outputs"] if o["name"] == "label"), None)
        if answer_id != request_id or labels != expected.flatten().tolist():
            self.tally.wrong.append(request_id)

    async def load(self) -> int:
        from digits_data import load_holdout  # noqa: PLC0415 - examples/ is on sys.path

        xs, _ = load_holdout()
        reference = ort.InferenceSession(str(self.repository / "digits" / "1" / "model.onnx"),
                                         providers=["CPUExecutionProvider"])  # fmt: skip
        timeout = aiohttp.ClientTimeout(total=self.args.request_timeout_s + 10)
        tasks: set[asyncio.Task] = set()
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
            chaos = asyncio.create_task(self.chaos())
            n = 0
            while (elapsed := time.monotonic() - self.started) < self.args.duration_s:
                due = self.started + n / self.args.rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                start = self.rng.randrange(len(xs) - 4)
                x = np.ascontiguousarray(xs[start : start + self.rng.randint(1, 4)])
                expected = reference.run(["label"], {"input": x})[0]
                task = asyncio.create_task(self.one(session, n, x, expected))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n += 1
                self.tally.sent = n
                del elapsed
            await chaos
            self.log(f"load done: {n} sent; draining {len(tasks)} in flight")
            if tasks:
                await asyncio.wait(list(tasks), timeout=self.args.drain_s)
            lost = len(tasks)
            for task in list(tasks):
                task.cancel()
            return lost


def _kind(error: str) -> str:
    """A short failure reason from the server's error text."""
    text = error.lower()
    kinds = (("redis", "redis"), ("queue", "queue"), ("timed out", "deadline"), ("expired", "deadline"),
             ("not ready", "not-ready"), ("unknown model", "unknown-model"))
    for word, kind in kinds:
        if word in text:
            return kind
    return text[:60]


def build_repository(workdir: Path) -> Path:
    out = workdir / "models"
    subprocess.run([sys.executable, str(ROOT / "examples" / "build_repository.py"), str(out)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    return out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="naiad-soak-")))
        workdir.mkdir(parents=True, exist_ok=True)
        repository = args.repository or build_repository(workdir)
        soak = Soak(args, workdir, repository)
        soak.start()
        try:
            soak.started = time.monotonic()
            lost = asyncio.run(soak.load())
        finally:
            soak.stop()
        result = {"machine": machine(), "duration_s": args.duration_s, "rate": args.rate,
                  "kill_every_s": args.kill_every_s, "appendonly": not args.no_appendonly,
                  **soak.tally.summary(lost)}  # fmt: skip
        print(json.dumps(result, indent=2))
        bad = result["lost"] or result["duplicated"] or result["wrong"] or result["failed"]
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
