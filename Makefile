# Two commands on a fresh machine: `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export PREFECT_HOME := $(CURDIR)/.prefect_home
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 90
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test lint wheel-smoke install install-dev clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned: it takes the local CPU wheel, and nothing after it may pull a CUDA build.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	$(BIN)/ssdgen demo --out out/run

# the linter first: seconds, where the suite takes minutes
test: install-dev
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install-dev
	$(BIN)/ruff check .

# the built wheel in a fresh venv, run from an empty folder: package data complete, nothing read from the
# checkout (infra/wheel-smoke.sh; about 2 minutes, 1 of them installing)
wheel-smoke: install-dev
	infra/wheel-smoke.sh

clean:
	rm -rf $(VENV) out .prefect_home .pytest_cache
