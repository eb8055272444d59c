# devplug's entry points. Every target sets up what it needs (a virtual
# environment in .venv with the core, the test kit under testkit/ (the
# devplug-testing distribution), every driver under drivers/, and the dev
# tools) from a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DRIVERS := $(sort $(dir $(wildcard drivers/*/pyproject.toml)))
STAMP := $(VENV)/.devplug-installed

.PHONY: all demo setup test lint typecheck unit proto bench bench-compare clean vm-assets dist image docs docs-tools

all: test

# The test kit (devplug-testing, testkit/src) is installed editable first, as a plain path (editable_mode=compat: a
# .pth naming testkit/src, which core/devplug/__init__.py's extend_path joins to the devplug package, and which mypy
# follows, as it follows no import hook); --no-deps, since it and the core need each other (devplug depends on
# devplug-testing until 1.0): the second install finds it there.
$(STAMP): pyproject.toml testkit/pyproject.toml $(wildcard drivers/*/pyproject.toml)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-deps -e testkit --config-settings editable_mode=compat
	$(BIN)/python -m pip install --quiet -e '.[dev]' $(foreach d,$(DRIVERS),-e $(d))
	touch $@

# The embedded default: a dev kubelet, the daemon on config.example.toml, a pod lifecycle.
demo: $(STAMP)
	$(BIN)/devplug demo

# What the tests need from the machine besides the virtual environment: Debian's Graphviz for the documentation's
# diagrams (docs-tools) and promtool for the alerts' tests (Debian's prometheus package, .ci/setup-promtool, which
# never starts its server). Set-up apart from testing: run once before the tests, idempotent, a no-op (no apt, no
# root) when everything is installed; apt waits for another apt's lock (tools/apt-get), as on a fresh VM whose
# unattended-upgrades holds it. .ci/run also sets up QEMU and etcd (.ci/setup-vm, .ci/setup-etcd).
setup: docs-tools
	bash .ci/setup-promtool

# The machine's set-up, lint, type-check (strict for core/), then every test (tests/test_docs_site.py builds the
# documentation site and checks its links).
test: setup lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint Dockerfile

# Each driver's tests are checked on their own, so every driver may have its own tests/conftest.py
# (mypy would otherwise see several modules named conftest).
typecheck: $(STAMP)
	$(BIN)/mypy
	@set -e; for t in $(wildcard drivers/*/tests); do \
		echo "mypy $$t"; MYPYPATH=core:testkit/src:$$(dirname $$t):$$(dirname $$t)/demo:$$t $(BIN)/mypy $$t/*.py; done

# The tests run in TEST_WORKERS processes (pytest-xdist; 0, the default, runs them in this process), each test file
# whole in one worker (--dist loadfile). Three workers on CI's two cores took the suite from 1,487 s to 625-710 s, but
# tests that wait on the clock beside a busy machine failed in 3 of 7 full runs (the metrics flood below, a bench
# daemon's start, the vfio end-to-end case in the VM), so make test stays in one process until they wait on events:
# `make test TEST_WORKERS=3` to try it. Tests marked `alone` (a flood racing the probes for the machine's time) run
# afterwards by themselves; pytest's exit status 5 there means the arguments selected none of them.
TEST_WORKERS ?= 0
unit: $(STAMP)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m "not alone" $(PYTEST_ARGS)
	$(BIN)/pytest -m alone $(PYTEST_ARGS) || test $$? -eq 5

# Regenerate core/devplug/api/gen from proto/ (tests/test_proto.py checks it is current).
proto: $(STAMP)
	$(BIN)/python tools/gen_proto.py

# Then the run's figures become the figures of record, bench/record.json, which the documentation quotes
# (tools/docs/benchfigures.py): commit it with what the run measured.
# (The shared driver's demo, whose nodes the hand-over figure uses, sits beside the driver's package: PYTHONPATH.)
bench: export PYTHONPATH := drivers/shared/demo
bench: $(STAMP)
	$(BIN)/python -m bench
	$(BIN)/python -m bench.record

# What changed: today's working tree against the commit REF on this machine (python -m bench.compare, a report, never
# recorded). REF's daemons run from a git worktree of REF, the harness from today's tree; Allocate runs both daemons
# in one interleaved series, every other part of `make bench` one side then the other, the order turned round each
# round. Each figure: both sides' medians, today/REF with its spread over the rounds, flagged beyond the noise.
# BENCH_COMPARE_ARGS: e.g. --rounds 4 --only allocate_ratio_p50,startup_ratio,shared (see --help).
bench-compare: export PYTHONPATH := drivers/shared/demo
bench-compare: $(STAMP)
	@test -n "$(REF)" || { echo "usage: make bench-compare REF=<commit> [BENCH_COMPARE_ARGS='--rounds N --only ...']"; exit 2; }
	$(BIN)/python -m bench.compare $(REF) $(BENCH_COMPARE_ARGS)

# The wheels and sdists users install (PEP 517, `python -m build`: each sdist, then its wheel built from it), the
# core's, the test kit's (devplug-testing, testkit/: drivers' tests depend on it; the image leaves it out) and every
# driver's, into dist/; their third-party dependencies, those of every extra for users included
# (tools/image/contents.py lists the wheels with their extras), into dist/wheelhouse (from PyPI, so that
# tests/deploy/test_wheels.py installs into a fresh venv with --no-index); dist/SOURCE-DIGEST says what they were
# built from.
DIST ?= dist
dist: $(STAMP)
	rm -rf $(DIST)
	$(BIN)/python -m build --outdir $(DIST) .
	$(BIN)/python -m build --outdir $(DIST) testkit
	@set -e; for d in $(DRIVERS); do $(BIN)/python -m build --outdir $(DIST) $$d; done
	$(BIN)/python -m pip download --quiet --dest $(DIST)/wheelhouse --find-links $(DIST) \
		$$($(BIN)/python tools/image/contents.py requirements $(DIST))
	@cd $(DIST) && for w in *.whl; do rm -f wheelhouse/$$w; done  # the wheelhouse: third-party wheels only
	$(BIN)/python tools/dist_digest.py > $(DIST)/SOURCE-DIGEST
	@ls -1 $(DIST)

# An OCI image of the daemon without a Docker engine, devplug:VERSION: a Debian root filesystem (debootstrap) with
# the wheels of `make dist` installed (every extra for users, every driver; not the test kit), packed by umoci into build/image/oci
# and build/image/devplug-VERSION.oci.tar, then smoke-tested with podman: `devplug check-config` on every config
# deploy/ renders, and the daemon of the mock overlay registering with a dev kubelet through the DaemonSet's mounts,
# then handing the node over to a second pod of the image (tools/image/smoke.py). Needs root; tools/image/setup.sh installs Debian's debootstrap, umoci and podman. Not
# part of `make test`.
image: dist
	PYTHON=$(BIN)/python bash tools/image/build.sh $(DIST) build/image

# The documentation site: docs/ built by Sphinx (MyST Markdown, the Furo theme, Graphviz diagrams from
# docs/diagrams/, the bench figures of bench/record.json) into build/docs, warnings as errors (a link to a missing
# page or heading is one, and so is a bench key the record lacks), then every internal link and anchor of the built
# site checked and anything loaded from the network refused (tools/docs/checklinks.py). Offline.
DOCS_OUT ?= build/docs
docs: $(STAMP) docs-tools
	rm -rf $(DOCS_OUT)
	$(BIN)/sphinx-build -W --keep-going -n -q -b html docs $(DOCS_OUT)
	$(BIN)/python tools/docs/checklinks.py $(DOCS_OUT)
	@echo "open $(DOCS_OUT)/index.html"

# Graphviz's dot for the diagrams (Debian's package, installed when missing; waits for another apt's lock).
docs-tools:
	bash tools/docs/setup.sh

# QEMU and the distribution kernel for the real-kernel suite (Debian packages, into .vm/).
vm-assets:
	bash tools/vm/fetch-assets.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache bench/results.json $(DIST) build
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
