#!/usr/bin/env bash
# Creates the peers' own virtual environments (their dependencies conflict with Naiad's):
#   .bench/venvs/mlserver  mlserver 1.7.1 + onnxruntime (runtime: bench/peers/mlserver_onnx.py)
#   .bench/venvs/kserve    kserve 0.21.0 + onnxruntime (server: bench/peers/kserve_server.py)
#   .bench/venvs/triton    nvidia-pytriton 0.7.0 (tritonserver 2.51, Python backend) + onnxruntime,
#                          which bench/peers/digits_python/model.py imports (bench/peers/triton.py)
# ONNX Runtime is pinned to the main venv's version, so every server runs the same kernels.
# Idempotent: a venv whose stamp names the same interpreter and packages is left alone.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
VENVS=$ROOT/.bench/venvs
ORT=$("$ROOT/.venv/bin/python" -c 'import onnxruntime; print(onnxruntime.__version__)' 2>/dev/null || true)
ORT_REQ=${ORT:+onnxruntime==$ORT}
ORT_REQ=${ORT_REQ:-onnxruntime>=1.17}

make_venv() {
  local name=$1; shift
  local dir=$VENVS/$name want
  want="$(readlink -f "$(command -v "$PYTHON")") $*"  # the interpreter too: another one makes it anew
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$want" ]; then
    echo "$name: up to date ($want)"; return
  fi
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  "$dir/bin/pip" install -q --upgrade pip
  "$dir/bin/pip" install -q "$@"
  echo "$want" > "$dir/.stamp"
  echo "$name: installed ($want)"
}

make_venv mlserver "mlserver==1.7.1" "$ORT_REQ"
make_venv kserve "kserve==0.21.0" "$ORT_REQ"
make_venv triton "${PYTRITON:-nvidia-pytriton==0.7.0}" "$ORT_REQ"  # the Makefile passes its PYTRITON
# Smoke checks: each imports its server and its runtime module.
PYTHONPATH=$ROOT/bench/peers "$VENVS/mlserver/bin/python" -c 'import mlserver_onnx, mlserver; print("mlserver", mlserver.__version__)'
"$VENVS/kserve/bin/python" -c 'import kserve, onnxruntime; print("kserve ok, onnxruntime", onnxruntime.__version__)'
"$VENVS/triton/bin/python" -c 'import onnxruntime, pytriton, pathlib; home = pathlib.Path(pytriton.__file__).parent / "tritonserver"; assert (home / "bin" / "tritonserver").exists(); print("triton ok,", home)'
