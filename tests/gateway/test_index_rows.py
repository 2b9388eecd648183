"""Triton's repository index rows, one per version (gateway/dataplane.py: index_rows)."""

from __future__ import annotations

from gateway.dataplane import index_rows
from naiad.registry import READY, UNAVAILABLE, ModelEntry
from repository_store import parse_config

CONFIG = parse_config(b'platform: "onnxruntime_onnx" max_batch_size: 1', "m")


def test_one_row_per_served_and_failed_version() -> None:
    entry = ModelEntry("m", CONFIG, [1, 3], READY, failed={2: "version 2 has no 'model.onnx'"})
    assert index_rows(entry) == [
        {"name": "m", "version": "1", "state": "READY", "reason": ""},
        {"name": "m", "version": "2", "state": "UNAVAILABLE", "reason": "version 2 has no 'model.onnx'"},
        {"name": "m", "version": "3", "state": "READY", "reason": ""},
    ]
    why = "rolled back automatically: ..."
    assert index_rows(entry, {3: why})[2] == {"name": "m", "version": "3", "state": "READY", "reason": why}


def test_a_model_without_versions_has_one_row() -> None:
    broken = ModelEntry("m", None, reason="config.pbtxt of 'm' does not parse")
    assert index_rows(broken) == [{"name": "m", "state": UNAVAILABLE, "reason": broken.reason}]
    unloaded = ModelEntry("m", None, [1], UNAVAILABLE, "unloaded")
    assert index_rows(unloaded) == [{"name": "m", "version": "1", "state": UNAVAILABLE, "reason": "unloaded"}]
