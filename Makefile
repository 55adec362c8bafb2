# Every target installs what it needs into .venv first, so each works on a fresh checkout.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help install demo test test-rust bench bench-search lint fmt clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-13s %s\n", $$1, $$2}'

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml Cargo.toml $(wildcard rust/src/*.rs)
	$(PY) -m pip install -q 'maturin>=1.7,<2'
	$(VENV)/bin/maturin develop --release -q --extras dev
	touch $(STAMP)

install: $(STAMP) ## Build the Rust extension (release) and install taps with test and lint tools into .venv

demo: install ## Search AlexNet on 2 nodes x 8 devices under both cost models
	$(VENV)/bin/taps search alexnet --nodes 2 --devices-per-node 8 --cost-model both

test: install ## Run the Python test suite
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
	cargo clippy --features python -- -D warnings
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches
	$(PY) -m mypy python/taps
	$(PY) -m mypy.stubtest taps._core

fmt: ## Format Rust and Python sources
	cargo fmt
	$(VENV)/bin/ruff format python tests benches

clean: ## Remove build outputs and the virtual environment
	rm -rf target $(VENV) python/taps/*.so
