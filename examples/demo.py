"""Naiad end to end: start ``naiad serve`` on the example repository and talk to it with
NVIDIA's own ``tritonclient``.

1. a cold start: the first ``digits`` request waits while a worker starts from zero;
2. the 360 held-out digits, one row per request, scored against the same ONNX file run here
   directly with onnxruntime (the answers must be identical), with latency percentiles;
   then the same rows through ``digits_pytorch`` (TorchScript) and ``digits_tensorflow``
   (SavedModel), which must give the ONNX model's probabilities within 1e-5 and its labels;
3. one 512-sample chunk through ``silero_vad`` (a recurrent model with explicit state);
4. the ``digits`` worker scaling back to zero, timed from its last request (the idle timeout);
then the server is stopped (SIGINT, SIGKILL if it does not exit).

Build the repository first: ``python examples/build_repository.py DIR`` (``make demo`` does).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.http as httpclient
from digits_data import load_holdout

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
INFER_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def naiad_command() -> list[str]:
    """The ``naiad`` script beside this interpreter, else on PATH, else ``python -m naiad_cli``."""
    script = shutil.which("naiad", path=str(Path(sys.executable).parent)) or shutil.which("naiad")
    return [script] if script else [sys.executable, "-m", "naiad_cli"]


def serve_accepts(serve: list[str], flag: str) -> bool:
    """Whether ``naiad serve --help`` lists ``flag``."""
    done = subprocess.run([*serve, "--help"], capture_output=True, text=True, timeout=60)
    return flag in done.stdout


def http_status(url: str) -> int | None:
    """The HTTP status of ``GET url``, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def wait_ready(process: subprocess.Popen, url: str, log: Path) -> float:
    """Wait for ``GET url`` to answer 200; returns the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < READY_TIMEOUT_S:
        if process.poll() is not None:
            raise RuntimeError(f"naiad serve exited with {process.returncode}")
        if http_status(url) == 200:
            return time.monotonic() - started
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {READY_TIMEOUT_S} s")


def tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def naiad_server(args: argparse.Namespace, log: Path) -> Iterator[tuple[str, str]]:
    """Run ``naiad serve``; yields ``(http_url, metrics_url)`` and stops it on the way out."""
    http_port, metrics_port = free_port(), free_port()
    serve = [*naiad_command(), "serve"]
    command = [
        *serve,
        "--model-repository", str(args.model_repository),
        "--http-port", str(http_port),
        "--metrics-port", str(metrics_port),
        "--idle-timeout", f"{args.idle_timeout:g}",
    ]  # fmt: skip
    if serve_accepts(serve, "--grpc-port"):  # keep gRPC off the default 8001 too
        command += ["--grpc-port", str(free_port())]
    if args.redis_url:
        command += ["--redis-url", args.redis_url]
    print("$", " ".join(command))
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        http_url = f"127.0.0.1:{http_port}"
        took = wait_ready(process, f"http://{http_url}/v2/health/ready", log)
        print(f"server ready in {took:.2f} s (log: {log})")
        yield http_url, f"http://127.0.0.1:{metrics_port}/metrics"
    finally:
        stop(process)


def stop(process: subprocess.Popen) -> None:
    """SIGINT, as Ctrl-C would; SIGKILL after ``STOP_TIMEOUT_S``."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"naiad serve ignored SIGINT for {STOP_TIMEOUT_S} s; killing it")
            process.kill()
            process.wait()
    print(f"server stopped (exit code {process.returncode})")


def model_workers(metrics_url: str, model: str) -> float | None:
    """``naiad_model_workers{model=...}`` from the Prometheus text, None when absent."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    pattern = rf'^naiad_model_workers\{{[^}}]*model="{re.escape(model)}"[^}}]*\}}\s+(\S+)'
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else None


# The digits classifier in every framework: model -> (input, (probabilities, label) outputs).
DIGITS_MODELS = {
    "digits": ("input", ("probabilities", "label")),
    "digits_pytorch": ("input__0", ("output__0", "output__1")),
    "digits_tensorflow": ("input", ("probabilities", "label")),
}


def infer_digits_outputs(
    client: httpclient.InferenceServerClient, rows: np.ndarray, model: str = "digits"
) -> tuple[np.ndarray, np.ndarray]:
    """``(probabilities [n, 10], labels [n])`` for ``rows`` (float32 [n, 64], n <= 64)."""
    input_name, outputs = DIGITS_MODELS[model]
    request = httpclient.InferInput(input_name, list(rows.shape), "FP32")
    request.set_data_from_numpy(rows)
    result = client.infer(
        model,
        [request],
        outputs=[httpclient.InferRequestedOutput(name) for name in outputs],
        timeout=int(INFER_TIMEOUT_S * 1e6),
    )
    return result.as_numpy(outputs[0]), result.as_numpy(outputs[1]).reshape(-1)


def infer_digits(client: httpclient.InferenceServerClient, rows: np.ndarray) -> np.ndarray:
    """Labels for ``rows`` (float32 [n, 64], n <= 64) from the served ``digits`` model."""
    return infer_digits_outputs(client, rows)[1]


def cold_start(client: httpclient.InferenceServerClient, metrics_url: str, x: np.ndarray) -> None:
    print("\n1. cold start")
    print(f'   naiad_model_workers{{model="digits"}} before: {model_workers(metrics_url, "digits")}')
    started = time.perf_counter()
    infer_digits(client, x[:1])
    print(f"   first digits request (worker started from zero): {time.perf_counter() - started:.2f} s")
    print(f'   naiad_model_workers{{model="digits"}} after: {model_workers(metrics_url, "digits")}')


def score_holdout(client: httpclient.InferenceServerClient, repository: Path) -> None:
    print("\n2. the 360 held-out digits")
    x, y = load_holdout()
    latencies_ms, served = [], []
    for row in x:
        started = time.perf_counter()
        served.append(infer_digits(client, row[None, :])[0])
        latencies_ms.append((time.perf_counter() - started) * 1e3)
    served = np.asarray(served)
    batched = np.concatenate([infer_digits(client, x[i : i + 64]) for i in range(0, len(x), 64)])
    session = ort.InferenceSession(str(repository / "digits" / "1" / "model.onnx"))
    local = session.run(["label"], {"input": x})[0].reshape(-1)
    p50, p99 = np.percentile(latencies_ms, [50, 99])
    print(f"   accuracy via naiad, 1 row per request:   {np.mean(served == y):.4f}")
    print(f"   accuracy via naiad, 64 rows per request: {np.mean(batched == y):.4f}")
    print(f"   accuracy via onnxruntime in-process:     {np.mean(local == y):.4f}")
    print(f"   single-row latency p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    if not (np.array_equal(served, local) and np.array_equal(batched, local)):
        raise AssertionError("naiad's answers differ from onnxruntime run in-process")


def other_frameworks(client: httpclient.InferenceServerClient, repository: Path) -> None:
    """The holdout through the TorchScript and SavedModel digits, against the ONNX one."""
    x, _ = load_holdout()
    reference = [infer_digits_outputs(client, x[i : i + 64]) for i in range(0, len(x), 64)]
    for model in ("digits_pytorch", "digits_tensorflow"):
        if not (repository / model / "config.pbtxt").is_file():
            print(f"   {model}: not in the repository, skipped")
            continue
        started = time.perf_counter()
        served = [infer_digits_outputs(client, x[i : i + 64], model) for i in range(0, len(x), 64)]
        took = time.perf_counter() - started
        gap = max(float(np.max(np.abs(p - q))) for (p, _), (q, _) in zip(served, reference, strict=True))
        same = all(np.array_equal(a, b) for (_, a), (_, b) in zip(served, reference, strict=True))
        print(f"   {model}: max |p - p_onnx| {gap:.1e}, same labels: {same} "
              f"({took:.2f} s, its cold start included)")
        if gap > 1e-5 or not same:
            raise AssertionError(f"{model} disagrees with the ONNX digits model")


def voice_activity(client: httpclient.InferenceServerClient) -> None:
    print("\n3. silero_vad on one 512-sample chunk at 16 kHz (a 440 Hz tone)")
    t = np.arange(512, dtype=np.float32) / 16000
    arrays = {
        "input": (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None, :],
        "state": np.zeros((2, 1, 128), dtype=np.float32),
        "sr": np.array([16000], dtype=np.int64),
    }
    inputs = []
    for name, array in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), "INT64" if name == "sr" else "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    started = time.perf_counter()
    result = client.infer("silero_vad", inputs, timeout=int(INFER_TIMEOUT_S * 1e6))
    took = time.perf_counter() - started
    speech, state = result.as_numpy("output"), result.as_numpy("stateN")
    print(f"   speech probability {float(speech[0, 0]):.3f}, state out {list(state.shape)}")
    print(f"   {took:.2f} s, including the silero_vad worker's cold start")


def scale_to_zero(
    client: httpclient.InferenceServerClient, metrics_url: str, idle_timeout_s: float, x: np.ndarray
) -> None:
    """One last ``digits`` request (the steps before may have let its worker go already),
    then the time from its answer until ``naiad_model_workers`` shows 0 for ``digits``."""
    print(f"\n4. scale to zero (idle timeout {idle_timeout_s:g} s)")
    infer_digits(client, x[:1])
    last_request = time.monotonic()
    print(f'   last digits request answered; naiad_model_workers{{model="digits"}}: '
          f'{model_workers(metrics_url, "digits")}')
    while time.monotonic() < last_request + idle_timeout_s + 30:
        if model_workers(metrics_url, "digits") == 0:
            idle_s = time.monotonic() - last_request
            print(f"   digits back to 0 workers {idle_s:.1f} s after its last request")
            return
        time.sleep(0.25)
    print(f"   digits still has {model_workers(metrics_url, 'digits')} workers; giving up")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repository", type=Path, required=True, metavar="DIR")
    parser.add_argument("--idle-timeout", type=float, default=5.0, metavar="SECONDS")
    parser.add_argument("--redis-url", help="use this Redis instead of an embedded one")
    args = parser.parse_args(argv)
    if not (args.model_repository / "digits" / "config.pbtxt").is_file():
        parser.error(f"no digits model in {args.model_repository}; run build_repository.py first")
    with tempfile.TemporaryDirectory(prefix="naiad-demo-") as tmp:
        log = Path(tmp) / "naiad-serve.log"
        try:
            with naiad_server(args, log) as (http_url, metrics_url):
                client = httpclient.InferenceServerClient(http_url, network_timeout=INFER_TIMEOUT_S)
                try:
                    x, _ = load_holdout()
                    cold_start(client, metrics_url, x)
                    score_holdout(client, args.model_repository)
                    other_frameworks(client, args.model_repository)
                    voice_activity(client)
                    scale_to_zero(client, metrics_url, args.idle_timeout, x)
                finally:
                    client.close()
        except BaseException:
            if log.exists():
                print(f"--- last lines of the server log ---\n{tail(log)}", file=sys.stderr)
            raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
