"""The latency of a Python model's BLS call, source trees side by side.

A request to ``tests/e2e/python_models/bls`` makes one ``InferenceRequest(...).exec()`` to
``digits`` (ONNX). Each ``--tree`` runs its own ``naiad serve`` (embedded Redis) in turn, one
after the other: five warm-up requests, then ``--requests`` sequential ones over HTTP
(tritonclient), their p50 and minimum in ms::

    git worktree add /tmp/base <commit>
    .venv/bin/python -m bench.perf.bls_call --tree /tmp/base --tree .
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from bench.perf.models import DEFAULT_REPOSITORY, ROOT, ensure_repository
from bench.perf.servers import run_folder, running, start_naiad


def repository() -> Path:
    """``digits`` from the benchmark repository and the ``bls`` test model, side by side."""
    ensure_repository(models=("digits",))
    folder = ROOT / ".bench" / "bls-repository"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(DEFAULT_REPOSITORY / "digits", folder / "digits")
    shutil.copytree(ROOT / "tests" / "e2e" / "python_models" / "bls", folder / "bls")
    return folder


def measure(tree: Path, repo: Path, workdir: Path, requests: int) -> list[float]:
    """Seconds of each measured request to ``bls`` on ``tree``'s server."""
    with running(start_naiad(repo, workdir, ["digits", "bls"], name=f"bls-{tree.resolve().name}",
                             tree=tree.resolve())) as server:  # fmt: skip
        client = httpclient.InferenceServerClient(server.http_url)
        pixels = httpclient.InferInput("PIXELS", [1, 64], "FP32")
        pixels.set_data_from_numpy(np.random.default_rng(0).random((1, 64), dtype=np.float32))
        took = []
        try:
            for _ in range(5 + requests):
                started = time.perf_counter()
                client.infer("bls", [pixels])
                took.append(time.perf_counter() - started)
        finally:
            client.close()
    return took[5:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, action="append", required=True)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()
    repo, workdir = repository(), run_folder(ROOT / ".bench" / "logs", "bls-call")
    for tree in args.tree:
        took = measure(tree, repo, workdir, args.requests)
        print(f"{tree}: BLS request p50 {statistics.median(took) * 1000:.2f} ms, "
              f"min {min(took) * 1000:.2f} ms ({len(took)} requests)")  # fmt: skip


if __name__ == "__main__":
    main()
