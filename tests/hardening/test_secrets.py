"""Issue 17, finding 4: neither ``ps`` nor a ``model.py`` sees a secret. The gateway's API
keys come from ``NAIAD_*`` variables, the embedded Redis has a generated password; a Python
model reports its environment, its command line, and what Redis answers it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import psutil
import redis
import tritonclient.http as httpclient
from naiad_harness import run_server

from naiad.redis_server import EmbeddedRedis

MODELS = Path(__file__).parent / "models"
API_KEY = "Bearer hardening-api-key-0123456789"


def probe(server) -> list[str]:
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        text = httpclient.InferInput("TEXT", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"?"], dtype=np.object_))
        result = client.infer("env_probe", [text], headers={"Authorization": API_KEY})
        return [item.decode() for item in result.as_numpy("FOUND")]
    finally:
        client.close()


def process_texts(server) -> list[str]:
    """Command line and initial environment (what ``ps e`` shows) of every child."""
    texts = []
    for proc in server.children():
        try:
            texts.append(" ".join(proc.cmdline()))
            texts.append(json.dumps(proc.environ()))
        except psutil.Error:
            continue
    return texts


def test_workers_and_model_code_see_no_secret(tmp_path):
    repository = tmp_path / "models"
    shutil.copytree(MODELS / "env_probe", repository / "env_probe")
    env = {"NAIAD_HTTP_RESTRICTED_API": json.dumps([f"inference:Authorization={API_KEY}"])}
    with run_server(repository, tmp_path / "serve", extra_env=env) as server:
        found = probe(server)
        socket_path = re.search(r"embedded redis-server at (\S+)", server.log()).group(1)
        config = Path(socket_path).with_name("redis.conf")
        assert config.stat().st_mode & 0o077 == 0  # 0600: only the server's user reads it
        password = re.search(r"^requirepass (\S+)$", config.read_text(), re.M).group(1)
        seen = "\n".join(found + process_texts(server))
        for secret in (API_KEY.split()[-1], password):
            assert secret not in seen
        assert "unix://" not in seen and "redis://" not in seen
        assert f"redis {socket_path}: -NOAUTH Authentication required." in found, found


def test_redis_url_with_an_acl_user(tmp_path, example_repository, digits_onnx):
    """``--redis-url`` naming an ACL user (the default user off) works end to end, and the
    URL, password included, reaches no worker's command line or environment."""
    with EmbeddedRedis(socket_path=tmp_path / "acl" / "redis.sock") as store:
        admin = redis.Redis(unix_socket_path=str(store.socket_path))
        admin.execute_command("ACL", "SETUSER", "naiad", "on", ">acl-pass-42", "~*", "&*", "+@all")
        admin.execute_command("ACL", "SETUSER", "default", "off")
        url = f"unix://naiad:acl-pass-42@{store.socket_path}"
        with run_server(example_repository, tmp_path / "serve", extra_env={"NAIAD_REDIS_URL": url}) as server:
            client = httpclient.InferenceServerClient(server.url, network_timeout=60)
            try:
                x = np.random.default_rng(4).random((3, 64), dtype=np.float32)
                tensor = httpclient.InferInput("input", [3, 64], "FP32")
                tensor.set_data_from_numpy(x)
                np.testing.assert_array_equal(client.infer("digits", [tensor]).as_numpy("label"),
                                              digits_onnx.run(["label"], {"input": x})[0])
            finally:
                client.close()
            seen = "\n".join(process_texts(server))
            assert "acl-pass-42" not in seen and server.worker_processes("digits")
