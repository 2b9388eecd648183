"""``bench.scenarios.settle``: a server is measured only once its process tree is quiet, and
after one request to each model (the floor server as the real one)."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

from bench import scenarios

BUSY_THEN_IDLE = "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass\ntime.sleep(60)\n"


def test_settle_waits_until_the_tree_is_quiet():
    child = subprocess.Popen([sys.executable, "-c", BUSY_THEN_IDLE])
    try:
        started = time.monotonic()
        scenarios.settle(SimpleNamespace(pid=child.pid), [])
        waited = time.monotonic() - started
    finally:
        child.kill()
        child.wait()
    assert 1.2 + scenarios.QUIET_FOR_S <= waited < scenarios.SETTLE_S  # busy 1.5 s, then quiet


def test_settle_primes_each_model_of_a_real_server(tmp_path):
    from bench.perf.models import DEFAULT_REPOSITORY, ensure_repository, target
    from bench.perf.servers import running, start_floor

    repo = ensure_repository(DEFAULT_REPOSITORY, ["digits"])
    with running(start_floor(repo, tmp_path, ["digits"])) as server:
        started = time.monotonic()
        # the probe inside raises unless the model answers with its outputs
        scenarios.settle(server, [target(server.http_url, "digits", "http", "json")])
    assert time.monotonic() - started < scenarios.SETTLE_S
