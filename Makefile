# Naiad: the two set-up commands (`make serve`, `make test`) and the demo.
# The interpreter every venv is made with: the distribution's CPython 3.11 (/usr/bin/python3.11;
# Debian and Ubuntu build it with PGO and LTO) where it can make venvs, else python3 on PATH.
# A plain `./configure` build (pyenv's default) ran Naiad 1.13x slower at c1 and 1.34x at c32
# here (docs/benchmarks.md, "Stop 35"). Another: make PYTHON=/path/to/python3.11 (after make clean).
ifeq ($(origin PYTHON), undefined)
PYTHON := $(shell /usr/bin/python3.11 -c 'import ensurepip, venv' >/dev/null 2>&1 && echo /usr/bin/python3.11 || echo python3)
endif
VENV := .venv
BIN := $(VENV)/bin
REPO ?= model_repository
# Extra `naiad serve` flags: make serve SERVE_ARGS="--http-port 9000 --grpc-port 9001"
SERVE_ARGS ?=
SILERO_VAD := silero-vad==6.2.3
# Real Triton (tritonserver 2.51 + its Python backend) for tests/differential, in its own venv:
# its pins (grpcio, protobuf, numpy) are not ours. A venv that cannot be made fails `make test`.
TRITON_VENV := .venv-triton
PYTRITON := nvidia-pytriton==0.7.0

.PHONY: serve test demo install triton-venv repo lint clean bench-setup bench-overhead bench-throughput bench-peers bench-coldstart bench-cache bench-profile

$(BIN)/naiad: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[dev]'
	# silero-vad only ships the ONNX file we serve; its torch dependency is not needed.
	$(BIN)/pip install --no-deps $(SILERO_VAD)
	touch $(BIN)/naiad

install: $(BIN)/naiad

$(TRITON_VENV)/.installed-$(PYTRITON):
	rm -rf $(TRITON_VENV)
	$(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install -q $(PYTRITON)
	touch '$@'

triton-venv: $(TRITON_VENV)/.installed-$(PYTRITON)

repo: install
	$(BIN)/python examples/build_repository.py $(REPO)

serve: repo
	$(BIN)/naiad serve --model-repository $(REPO) $(SERVE_ARGS)

demo: repo
	$(BIN)/python examples/demo.py --model-repository $(REPO)

test: install triton-venv
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -qq && apt-get install -y -qq chromium; } || echo "chromium not installed: the status page's browser test will be skipped"
	$(BIN)/python -m pytest -q

# Benchmarks (docs/benchmarks.md). bench-setup: MLServer and KServe in their own venvs under .bench/.
bench-setup: install
	PYTHON=$(PYTHON) PYTRITON=$(PYTRITON) bash bench/peers/setup.sh

bench-overhead bench-throughput bench-coldstart bench-cache: install
	$(BIN)/python -m bench.scenarios $(@:bench-%=%) $(BENCH_ARGS)

bench-peers: bench-setup
	$(BIN)/python -m bench.scenarios peers $(BENCH_ARGS)

bench-profile: install
	$(BIN)/python -m bench.perf.profile $(BENCH_ARGS)

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(TRITON_VENV) $(REPO) .naiad-cache
