"""What an untrusted model.py can see: its environment, its command line, and whether the
server's Redis (any naiad-redis-* socket it can find) answers it without a password.
Answers one line per finding: ``env NAME=VALUE``, ``argv ...``, ``redis PATH: REPLY``."""

import glob
import os
import socket
import sys

import numpy as np

import triton_python_backend_utils as pb_utils


def _redis_reply(path):
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(2)
            sock.connect(path)
            sock.sendall(b"PING\r\n")
            return sock.recv(200).decode(errors="replace").strip()
    except OSError as exc:
        return f"unreachable: {exc}"


class TritonPythonModel:
    def execute(self, requests):
        found = [f"env {k}={v}" for k, v in os.environ.items()]
        found.append("argv " + " ".join(sys.argv))
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as cmdline:
            found.append("cmdline " + cmdline.read().replace(b"\0", b" ").decode(errors="replace"))
        for path in glob.glob("/tmp/naiad-redis-*/redis.sock"):
            found.append(f"redis {path}: {_redis_reply(path)}")
        out = np.array([line.encode() for line in found], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("FOUND", out)]) for _ in requests]
