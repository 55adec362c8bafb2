# Every target installs what it needs into .venv first, so each works on a fresh checkout.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
FRAMEWORKS := $(VENV)/.installed-frameworks

.PHONY: help install demo test test-rust bench bench-search lint fmt clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-13s %s\n", $$1, $$2}'

# The .venv steps must not see another environment the shell has active: maturin installs into
# the active virtualenv or conda environment, and PYTHONPATH/PYTHONHOME would leak into .venv.
# PIP_QUIET: maturin installs the dependencies with pip, which has no quiet flag of its own there.
unexport VIRTUAL_ENV CONDA_PREFIX CONDA_DEFAULT_ENV PYTHONHOME PYTHONPATH
MATURIN := PIP_QUIET=1 VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release --quiet

# A stamp is written only once everything is installed and importable from .venv, so a failed
# or interrupted install is redone by the next make, never taken for done.
$(STAMP): pyproject.toml Cargo.toml Cargo.lock $(shell find rust/src -name "*.rs")
	@rm -f $(STAMP)
	$(PY) -m pip --version >/dev/null 2>&1 || { rm -rf $(VENV) && python3 -m venv $(VENV); }
	$(PY) -m pip install --quiet --upgrade pip 'maturin>=1.7,<2'
	$(MATURIN) --extras dev
	$(PY) -c 'import taps._core, pytest, hypothesis, matplotlib'
	touch $(STAMP)

# torch and jax (several GB) and the real models the front-end tests build; the demo needs none.
$(FRAMEWORKS): pyproject.toml | $(STAMP)
	@rm -f $(FRAMEWORKS)
	$(MATURIN) --extras dev,torch,jax,test-models
	$(PY) -c 'import torch, jax'
	touch $(FRAMEWORKS)

install: $(STAMP) ## Build the Rust extension (release) and install taps with test and lint tools into .venv

demo: install ## Search AlexNet on 2 nodes x 8 devices under both cost models
	$(VENV)/bin/taps search alexnet --nodes 2 --devices-per-node 8 --cost-model both

test: $(FRAMEWORKS) ## Install the torch and jax extras too, then run the Python test suite
	$(PY) -m pytest -q

test-rust: ## Run the Rust tests (no Python needed)
	cargo test

# numpy's OpenBLAS threads spin on the cores the kernels measure; the benchmarks need none.
bench: install ## Run the Rust and Python benchmarks, then the search stage by stage
	cargo bench --bench core
	OPENBLAS_NUM_THREADS=1 $(PY) -m pytest benches -q -s --benchmark-enable
	OPENBLAS_NUM_THREADS=1 $(PY) benches/search_stages.py --large

bench-search: install ## The search stage by stage against the plain formulation (one table)
	OPENBLAS_NUM_THREADS=1 $(PY) benches/search_stages.py --large

lint: install ## cargo fmt, clippy (pedantic), ruff, mypy and the stub check (stubtest)
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --features python --lib --tests -- -D warnings
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches
	$(PY) -m mypy python/taps
	$(PY) -m mypy.stubtest taps._core

fmt: ## Format Rust and Python sources
	cargo fmt
	$(VENV)/bin/ruff format python tests benches

clean: ## Remove build outputs and the virtual environment
	rm -rf target $(VENV) python/taps/*.so
