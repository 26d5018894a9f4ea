# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
# One virtual environment, two install levels: the demo needs only the base package; the tests
# add PyTorch (CPU-only where the machine offers it), MLflow, matplotlib and the test tools.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
BASE := $(VENV)/.installed-base
DEV := $(VENV)/.installed-dev

.PHONY: demo test install

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(BASE): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(DEV): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@ $(BASE)

install: $(DEV)

demo: $(BASE)
	$(BIN)/collocate demo

test: $(DEV)
	$(BIN)/python -m pytest -q -n 3 --dist loadgroup
