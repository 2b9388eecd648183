"""The status page at ``GET /``: escaped values, served by a real server after traffic, and
rendered by headless Chromium (Debian's ``chromium`` package; skipped when it is missing)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from gateway.status_page import render_page

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def _row(**values) -> dict:
    row = {
        "name": "m", "state": "asleep", "reason": "", "versions": ["1"], "workers": 0, "queue": 0,
        "in_flight": 0, "success": 0, "failure": 0, "inferences": 0, "executions": 0,
        "avg_latency_ms": None, "p50_ms": None, "p99_ms": None,
        "cache_hits": 0, "cache_misses": 0, "cache_hit_ratio": None,
        "cold_starts": 0, "cold_start_avg_s": None, "last_inference_ms": 0,
        "load_failures": 0, "problem": "",
    }  # fmt: skip
    return row | values


def test_every_value_is_escaped():
    hostile = '<img src=x onerror="alert(1)">'
    snapshot = {
        "time": time.time(),
        "models": [_row(name=hostile, state="unavailable", reason="<script>alert(2)</script>",
                        problem="<script>alert(3)</script>", versions=["<b>1</b>"])],  # fmt: skip
        "counts": {"unavailable": 1},
    }
    page = render_page(snapshot)
    assert "<script>" not in page and "<img" not in page and "<b>1" not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in page
    assert "&lt;script&gt;alert(3)&lt;/script&gt;" in page
    assert '<meta http-equiv="refresh" content="2">' in page


def test_version_rows_are_drawn_and_escaped():
    version = {"version": "2", "state": "rolled back", "weight": 50, "share": 0, "success": 3, "failure": 7,
               "error_ratio": 0.7, "avg_latency_ms": 1.5, "reason": "<script>alert(4)</script>"}  # fmt: skip
    one = {**version, "version": "1", "state": "serving", "share": 100, "reason": ""}
    page = render_page({"time": time.time(), "models": [_row(version_rows=[one, version])], "counts": {}})
    assert "└ v2" in page and "rolled back 50%-&gt;0%" in page and "70.0% errors" in page
    assert "<script>" not in page and "&lt;script&gt;alert(4)&lt;/script&gt;" in page


def test_no_models():
    page = render_page({"time": time.time(), "models": [], "counts": {}})
    assert "no models in the registry" in page


def _traffic(server) -> None:
    client = httpclient.InferenceServerClient(server.url)
    batch = httpclient.InferInput("input", [1, 64], "FP32")
    batch.set_data_from_numpy(np.ones((1, 64), np.float32))
    for _ in range(2):
        client.infer("digits", [batch])
    client.close()


def test_served_at_root_after_traffic(naiad_server):
    server = naiad_server()
    _traffic(server)
    response = requests.get(f"{server.http}/", timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/html")
    page = response.text
    assert '<tr data-model="digits" data-state="busy">' in page  # answered in the last 5 s
    assert '<tr data-model="silero_vad" data-state="asleep">' in page
    assert '<span class="busy">1 busy</span>' in page


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not on PATH (Debian: apt-get install chromium; `make test` does it as root)")
    return path


def _run_chromium(chromium: str, *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=90,
        )


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.timeout(240)
def test_renders_in_headless_chromium(naiad_server, tmp_path):
    chromium = _chromium()
    server = naiad_server()
    _traffic(server)
    dom = _run_chromium(chromium, "--dump-dom", f"{server.http}/")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<title>Naiad status</title>" in dom.stdout
    assert re.search('data-model="digits" data-state="(busy|idle)"', dom.stdout)
    assert 'data-model="silero_vad" data-state="asleep"' in dom.stdout
    shot = tmp_path / "status.png"
    result = _run_chromium(chromium, f"--screenshot={shot}", "--window-size=1200,800", f"{server.http}/")
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    assert _png_size(shot) == (1200, 800)
    assert shot.stat().st_size > 10_000  # a rendered table, not a blank page
