# NotebookOS-rs — the two commands a newcomer needs:
#   make demo   the main job: a 3-host NotebookOS cluster on this machine, replicated kernels at work
#   make test   every test of the workspace (Rust and Python)
# Both install what they need first (scripts/install-deps.sh, idempotent).

SHELL := /bin/bash
CARGO ?= cargo
VENV := $(CURDIR)/.venv
# Tests and the demo use the venv's Python (ipykernel, jupyter_client, nbclient, ...).
export NBOS_PYTHON := $(VENV)/bin/python
export PATH := $(VENV)/bin:$(PATH)
# Where cargo puts the binaries and libraries the Python tests and the demo run.
export NBOS_BIN_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/debug

.PHONY: all deps build test test-rust test-python test-packaging test-upgrade chaos chaos-ci check-layers demo demo-stop lint fmt package clean fuzz fuzz-ci fuzz-corpus

all: build

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --workspace --all-targets

test: deps check-layers
	$(CARGO) build --workspace --all-targets
	$(MAKE) --no-print-directory test-rust
	$(MAKE) --no-print-directory test-python

# nextest does not run doctests, so they run after it (`cargo test` alone runs both).
test-rust:
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
	  $(CARGO) nextest run --workspace --no-fail-fast && $(CARGO) test --workspace --doc; \
	else \
	  $(CARGO) test --workspace --no-fail-fast; \
	fi

# No import circle between the files of a crate (docs/design.md: each layer uses only those below).
check-layers:
	python3 scripts/import-cycles.py daemon daemon/sched daemon/bench daemon/cli raft-store cuda-shim tests/support

# tests/jupyter and tests/browser include the JupyterHub users suites (test_jupyterhub_users.py,
# test_hub.py): JupyterHub from requirements-dev.txt, configurable-http-proxy in .nbos/hub-npm (deps).
test-python:
	$(NBOS_PYTHON) -m pytest -q python/tests $(wildcard tests/jupyter) $(wildcard tests/browser)

demo: deps
	$(CARGO) build --workspace
	@scripts/demo.sh start

demo-stop:
	@scripts/demo.sh stop

# Coverage-guided fuzzing (AFL++ via cargo-afl, stable Rust; docs/fuzzing.md): every target in
# turn, FUZZ_SECONDS each (FUZZ_TARGETS to pick some). Fails on any crash or hang.
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?=
fuzz: deps
	scripts/fuzz.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# CI: build the fuzz targets and run each a few seconds on its committed corpus.
fuzz-ci: deps
	scripts/fuzz.sh $(or $(FUZZ_CI_SECONDS),20)

# Rewrites fuzz/corpus/ from the real encoders (after a wire format changes).
fuzz-corpus: deps
	scripts/fuzz.sh 0
	$(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/fuzz/release/gen_corpus

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

# Debian and RPM packages of notebookosd + nbos, with -dbgsym/-debuginfo packages, into
# target/packages/ (installs cargo-deb / cargo-generate-rpm if missing).
package: deps
	bash scripts/package.sh

# The packages installed as an operator would (tests/packaging/run.sh: a Debian 12 root, apt,
# the installed daemon serving a cell, purge; the .rpm into a scratch root; lintian). Needs
# root; its Debian root and apt downloads are cached in /var/cache/notebookos-packaging.
# PACKAGE_PROFILE=dev PACKAGE_FAST=1: the test build's binaries, stripped the same way.
test-packaging: deps
	PACKAGE_PROFILE=$${PACKAGE_PROFILE:-dev} PACKAGE_FAST=$${PACKAGE_FAST:-1} bash tests/packaging/run.sh

# A rolling upgrade from an older version's binaries (built from git, OLD_REF=<commit>) to
# this checkout's: three hosts replaced one by one under a live kernel (tests/upgrade/).
test-upgrade: deps
	OLD_REF=$(OLD_REF) bash tests/upgrade/run.sh

# The fault campaign (tests/chaos/, docs/chaos.md): hosts in network namespaces with mutual
# TLS, faults drawn from SEED, a report; exits 1 on any anomaly. Needs root. With HOSTS >= 4
# (the default) every fault kind is drawn, `migrate` and `leave` (scale-in) included; with 3,
# those two are left out. CHAOS_ARGS passes more options (e.g. --json, --faults a,b --cycle).
ROUNDS ?= 100
SEED ?= 1
HOSTS ?= 4
chaos: build
	$(NBOS_PYTHON) tests/chaos/run.py --rounds $(ROUNDS) --seed $(SEED) --hosts $(HOSTS) $(CHAOS_ARGS)

# The short campaign CI runs every time (about 3 minutes): ten fault kinds once each, in order,
# on 4 hosts (minority, split and latency, close kin of isolate and lossy, are left to `make chaos`).
chaos-ci: build
	$(NBOS_PYTHON) tests/chaos/run.py --rounds 10 --seed 1 --hosts 4 --cycle \
	  --faults kill_restart,freeze,isolate,one_way,lossy,isolate_all,disk_full,cluster_restart,migrate,leave

clean:
	$(CARGO) clean
	rm -rf .nbos
