"""``naiad serve`` startup failures end the process instead of leaving it hanging."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest
from naiad_harness import ROOT, free_port


def test_serve_exits_when_http_port_is_taken(example_repository, tmp_path):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [
            sys.executable,
            "-m",
            "naiad_cli",
            "serve",
            "--model-repository",
            str(example_repository),
            "--http-port",
            str(port),
            "--metrics-port",
            str(free_port()),
            "--grpc-port",
            str(free_port()),
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
        process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            returncode = process.wait(20)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(5)
                state = "hung until SIGINT"
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                state = "hung, and ignored SIGINT"
            pytest.fail(
                f"naiad serve {state} with its HTTP port in use:\n{process.stdout.read().decode()[-2000:]}"
            )
        finally:
            process.stdout.close()
    assert returncode != 0
