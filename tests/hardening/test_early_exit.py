"""Issue 17, finding 5: a model whose worker cannot get as far as reporting. ``sys.exit()``
in ``model.py`` is caught as a load failure; ``os._exit()`` (a native crash, as far as the
worker can tell) is seen by the scaler, which backs off and, after the second such exit,
marks the model UNAVAILABLE: the waiting request fails with that reason, and the worker is
not restarted every tick."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from naiad_harness import run_server, wait_for
from tritonclient.utils import InferenceServerException

MODELS = Path(__file__).parent / "models"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("early-exit")
    for name in ("sysexit", "hard_exit"):
        shutil.copytree(MODELS / name, root / "models" / name)
    with run_server(root / "models", root / "serve", request_timeout_s=120) as running:
        yield running


def infer_error(server, model: str) -> str:
    client = httpclient.InferenceServerClient(server.url, network_timeout=150)
    try:
        x = httpclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.ones(1, np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer(model, [x])
        return str(info.value)
    finally:
        client.close()


def index(server) -> dict[str, dict]:
    listed = requests.post(f"{server.http}/v2/repository/index", json={}, timeout=10).json()
    return {m["name"]: m for m in listed}


def starts(server, model: str) -> int:
    return len(re.findall(rf"started worker pid \d+ for model '{model}'", server.log()))


def test_sys_exit_at_import_is_a_load_failure(server):
    message = infer_error(server, "sysexit")
    assert "SystemExit" in message, message
    entry = index(server)["sysexit"]
    assert entry["state"] == "UNAVAILABLE" and "SystemExit" in entry["reason"], entry
    assert starts(server, "sysexit") == 1


def test_worker_dying_before_it_reports_marks_the_model_unavailable(server):
    message = infer_error(server, "hard_exit")
    assert "before it could serve" in message and "code 7" in message, message
    entry = index(server)["hard_exit"]
    assert entry["state"] == "UNAVAILABLE" and "code 7" in entry["reason"], entry
    assert requests.get(f"{server.http}/v2/models/hard_exit/ready", timeout=5).status_code == 400
    # Two crashed starts, then (maybe) one for the backlog, which answers from the registry.
    wait_for(lambda: starts(server, "hard_exit") >= 2, 10, "two starts")
    assert starts(server, "hard_exit") <= 3, server.log()[-3000:]
    # A new request is refused at once with the reason, starting nothing.
    before = starts(server, "hard_exit")
    assert "code 7" in infer_error(server, "hard_exit")
    assert starts(server, "hard_exit") == before
