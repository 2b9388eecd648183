"""``naiad.procs``: what a child process is given (no secret in its environment or argv),
and its readiness pipe. Real child processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from naiad import procs

CHILD = """
import json, os, sys
from naiad import procs
procs.take_ready_fd()
url = procs.take_redis_url()
environ = open(f"/proc/{os.getpid()}/environ", "rb").read().decode(errors="replace")
print(json.dumps({"url": url, "env": dict(os.environ), "initial_env": environ, "argv": sys.argv}))
sys.stdout.flush()
if sys.argv[1] == "ready":
    procs.report_ready()
sys.exit(int(sys.argv[2]))
"""


def run_child(mode: str, code: int, env: dict[str, str]):
    process = procs.spawn_python([sys.executable, "-c", CHILD, mode, str(code)],
                                 redis_url="unix://:pw-secret-1@/tmp/x.sock", env=env,
                                 stdout=subprocess.PIPE)  # fmt: skip
    out, _ = process.communicate(timeout=60)
    return process, json.loads(out)


def test_the_redis_url_arrives_by_pipe_and_no_secret_by_environment():
    env = {**os.environ, "NAIAD_HTTP_RESTRICTED_API": '["inference:k=api-secret-2"]',
           "NAIAD_REDIS_URL": "redis://:pw-secret-3@h"}  # fmt: skip
    process, seen = run_child("ready", 0, env)
    assert seen["url"] == "unix://:pw-secret-1@/tmp/x.sock"
    shown = json.dumps([seen["env"], seen["initial_env"], seen["argv"]])
    for secret in ("pw-secret-1", "api-secret-2", "pw-secret-3"):
        assert secret not in shown
    assert procs.became_ready(process) is True


def test_a_child_that_exits_before_reporting_is_not_ready():
    process, _ = run_child("crash", 7, dict(os.environ))
    assert process.returncode == 7 and procs.became_ready(process) is False
    assert procs.became_ready(process) is False  # the verdict is kept, the pipe closed


def test_a_running_child_that_has_not_reported_is_unknown():
    process = procs.spawn_python([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.2)
        assert procs.became_ready(process) is None
    finally:
        procs.stop(process)
    assert procs.became_ready(process) is False


def test_a_child_is_in_its_own_session_so_a_terminals_ctrl_c_reaches_only_the_server():
    process = procs.spawn_python([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert os.getsid(process.pid) == process.pid != os.getsid(0)
        assert os.getpgid(process.pid) != os.getpgid(0)
    finally:
        procs.stop(process)


def test_a_worker_takes_its_redis_url_from_the_environment_as_kubernetes_gives_it(redis_url, tmp_path):
    """``naiad k8s render`` puts the URL in ``NAIAD_REDIS_URL`` (infra/render.py), not on the
    command line: a worker started so reaches Redis (its model is missing: it says so, exit 2),
    and one without any URL refuses to start."""
    args = [sys.executable, "-m", "naiad_cli", "worker", "--model", "absent", "--model-repository",
            str(tmp_path), "--idle-timeout", "1"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != procs.REDIS_URL_ENV}
    given = subprocess.run(args, env={**env, procs.REDIS_URL_ENV: redis_url}, capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert given.returncode == 2 and "cannot be served" in given.stderr, given.stderr[-2000:]
    missing = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "--redis-url is required" in missing.stderr
