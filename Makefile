# kernel-refinery: `make setup`, `make lint`, `make test`, `make demo`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# CPU machines get the CPU build of torch that lies on disk; a bare `torch` would pull several GB of CUDA.
TORCH_CPU := torch==2.13.0
# llama.cpp compiles from source for this CPU (-march=native) but without AMX: its AMX kernels crash
# with SIGSEGV on Q4_K models (llama.cpp issue 20824; seen here on a VM whose CPU has AMX).
ifeq ($(shell uname -m),x86_64)
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CMAKE := -DCMAKE_C_FLAGS="$(NO_AMX)" -DCMAKE_CXX_FLAGS="$(NO_AMX)"
endif

# clang++ and LLVM's OpenMP runtime build C++ candidates several times faster (tools/steps/pch.py): installed
# where root and apt allow; elsewhere C++ builds use GCC, only slower.
CLANG := { command -v clang++-19 || command -v clang++ \
	|| { [ "$$(id -u)" = 0 ] && command -v apt-get && apt-get update -q && apt-get install -y -q clang-19 libomp-19-dev; } \
	|| echo "setup: clang++ not installed (needs root and apt): C++ builds use GCC, only slower" >&2; } >/dev/null

.DEFAULT_GOAL := help
.PHONY: help setup test test-gpu test-drift demo lint docs clean

help:
	@echo "make setup     create .venv/ with the refinery command"
	@echo "make lint      ruff check, ruff format --check, mypy; each '# type: ignore' with a code and a reason"
	@echo "make test      run the test suite (CPU)"
	@echo "make docs      the API reference, build/api/index.html (pdoc; warnings fail)"
	@echo "make test-gpu  run the GPU tests (needs CUDA)"
	@echo "make test-drift  timings compared across evaluations (a quiet machine, not CI)"
	@echo "make demo      a real refinement experiment on 3 built-in CPU tasks"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/python -m pip install -q $(TORCH_CPU); fi
	CMAKE_ARGS='$(LLAMA_CMAKE)' $(BIN)/python -m pip install -q -e '.[test,docs,local,ray,kernelguard,serve,rl]'
	$(BIN)/python -m kernel_refinery.agent.chat.local_model prepare
	$(CLANG) && $(BIN)/python -m kernel_refinery.tools.steps.pch
	touch $(STAMP)

setup: $(STAMP)

# A `# type: ignore` names its error code and says why on the same line: `# type: ignore[code]  # why`.
lint: $(STAMP)
	@bad=$$(grep -rnE --include='*.py' '#\s*type:\s*ignore' agent tools traces bench tests prompts kernel_refinery benchmarks \
		| grep -vE '#\s*type:\s*ignore\[[^]]+\]\s+#\s*\S'); \
	if [ -n "$$bad" ]; then echo "$$bad"; echo "lint: write each '# type: ignore' as '# type: ignore[code]  # why'"; exit 1; fi
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The public API's reference pages, from kernel_refinery/api.py's docstrings; any warning fails the build.
docs: $(STAMP)
	rm -rf build/api
	$(BIN)/python -W error -m pdoc kernel_refinery.api -o build/api
	@echo "API reference: build/api/kernel_refinery/api.html"

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=8

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m gpu

# Timings compared across evaluations: on a quiet machine, not on CI's shared 2-core VMs (pyproject: drift).
test-drift: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m drift

demo: $(STAMP)
	rm -rf runs/demo
	$(BIN)/refinery experiment --config bench/configs/demo.toml
	$(BIN)/refinery traces html runs/demo -o runs/demo/report.html

clean:
	rm -rf $(VENV) build *.egg-info
