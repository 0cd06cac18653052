# The first two targets are the README's first two commands; both work on a fresh clone.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-dev clean

demo: $(VENV)/.installed
	$(BIN)/simserve run scenarios/quickstart.yaml --out runs/quickstart

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest tests

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(VENV)/bin/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/bin/python pyproject.toml
	$(BIN)/python -m pip install -q -e '.[dev,ray,profile]'
	touch $@ $(VENV)/.installed

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
