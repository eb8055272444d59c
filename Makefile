# devplug's entry points. Every target sets up what it needs (a virtual
# environment in .venv with the core, every driver under drivers/, and the dev
# tools) from a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DRIVERS := $(sort $(dir $(wildcard drivers/*/pyproject.toml)))
STAMP := $(VENV)/.devplug-installed

.PHONY: all demo test lint typecheck unit proto bench clean vm-assets

all: test

$(STAMP): pyproject.toml $(wildcard drivers/*/pyproject.toml)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' $(foreach d,$(DRIVERS),-e $(d))
	touch $@

# The embedded default: a dev kubelet, the daemon on config.example.toml, a pod lifecycle.
demo: $(STAMP)
	$(BIN)/devplug demo

# Lint, type-check (strict for core/), then every test.
test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Each driver's tests are checked on their own, so every driver may have its own tests/conftest.py
# (mypy would otherwise see several modules named conftest).
typecheck: $(STAMP)
	$(BIN)/mypy
	@set -e; for t in $(wildcard drivers/*/tests); do \
		echo "mypy $$t"; MYPYPATH=core:$$(dirname $$t):$$t $(BIN)/mypy $$t/*.py; done

unit: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

# Regenerate core/devplug/api/gen from proto/ (tests/test_proto.py checks it is current).
proto: $(STAMP)
	$(BIN)/python tools/gen_proto.py

bench: $(STAMP)
	$(BIN)/python -m bench

# QEMU and the distribution kernel for the real-kernel suite (Debian packages, into .vm/).
vm-assets:
	bash tools/vm/fetch-assets.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache bench/results.json
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
