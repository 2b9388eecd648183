"""The Dockerfiles (no Docker engine runs here): every path they copy exists, the images run
the CLI's commands, and the gateway image installs no ML framework."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from naiad_cli.commands import build_parser

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("onnxruntime", "torch", "tensorflow")


def _instructions(name: str) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (ROOT / "docker" / name).read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [tuple(line.split(None, 1)) for line in lines]  # type: ignore[misc]


@pytest.mark.parametrize("name", ["Dockerfile.gateway", "Dockerfile.worker"])
def test_copied_paths_exist_and_are_not_ignored(name: str) -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    copies = [args.split() for op, args in _instructions(name) if op == "COPY" and "--from" not in args]
    assert copies
    for *sources, _dest in copies:
        for source in sources:
            assert (ROOT / source).exists(), source
            assert source.rstrip("/") not in ignored


def _entrypoint(name: str) -> list[str]:
    ops = dict(_instructions(name))
    return json.loads(ops["ENTRYPOINT"]) + (json.loads(ops["CMD"]) if "CMD" in ops else [])


def test_gateway_image_runs_naiad_gateway_without_frameworks() -> None:
    command = _entrypoint("Dockerfile.gateway")
    assert command[0] == "naiad" and build_parser().parse_args(command[1:]).command == "gateway"
    ops = _instructions("Dockerfile.gateway")
    assert ops[0][1].startswith("python:3.11-slim") and ops[0][0] == "FROM"
    installs = " ".join(args for op, args in ops if op == "RUN" and "pip" in args)
    assert not any(framework in installs for framework in FRAMEWORKS)
    assert "[onnx]" not in installs


def test_worker_image_runs_naiad_worker_on_cuda() -> None:
    command = _entrypoint("Dockerfile.worker")
    args = build_parser().parse_args([*command[1:], "--model", "digits"])
    assert command[0] == "naiad" and args.command == "worker"
    ops = _instructions("Dockerfile.worker")
    assert any(op == "FROM" and args.startswith("nvidia/cuda:") for op, args in ops)
    text = (ROOT / "docker" / "Dockerfile.worker").read_text()
    for package in ("onnxruntime-gpu", "torch", "tensorflow"):
        assert package in text
