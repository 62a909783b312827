# scalelab — `make help` lists every target.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# CPU-only machines get the CPU build of torch; set TORCH_SPEC to override (e.g. TORCH_SPEC=torch).
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
ARGS ?=
PYTEST_ARGS ?=
# Tests run in parallel (pytest-xdist), one worker per core, at most 4: most of a test's time is
# the single-threaded start-up of the processes it drives. A worker more than the cores costs
# more CPU for the same tests and ends later (docs/development.md).
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))
PYTEST_PAR := -n $(TEST_JOBS) --dist worksteal

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@# Install torch first, pinned, so pip never pulls a multi-GB CUDA build on a CPU-only machine.
	$(PIP) install -q $(TORCH_SPEC)
	$(PIP) install -q -e ".[dev,hf,cluster]"
	@# Bytecode for our own (editable) sources: pip compiles site-packages, and an environment
	@# with PYTHONDONTWRITEBYTECODE=1 would otherwise recompile src/ at every start (~0.3 s).
	$(PY) -m compileall -q src
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install scalelab with its dev, hf and cluster extras

test: $(STAMP) ## Run the fast tests
	$(PY) -m pytest $(PYTEST_PAR) -m "not slow" $(PYTEST_ARGS)

test-all: $(STAMP) test-deps ## Run every test, slow ones included (what CI runs)
	$(PY) -m pytest $(PYTEST_PAR) $(PYTEST_ARGS)

test-deps: ## System packages the tests use: chromium (the UI's browser tests; apt-get, as root)
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } \
	      >/tmp/scalelab-test-deps.log 2>&1 || echo "apt-get install chromium failed (see /tmp/scalelab-test-deps.log): the browser tests will skip"; \
	  else echo "no chromium: the browser tests will skip (install it: apt-get install chromium)"; fi; }

lint: $(STAMP) ## ruff check
	$(VENV)/bin/ruff check src tests benchmarks scripts

format: $(STAMP) ## ruff format + autofix
	$(VENV)/bin/ruff check --fix src tests benchmarks scripts
	$(VENV)/bin/ruff format src tests benchmarks scripts

model-summary: $(STAMP) ## Print params/FLOPs per component (ARGS="--preset gpt2")
	$(PY) -m scalelab.model $(ARGS)

data: $(STAMP) ## Prepare token shards for the default dataset (ARGS="data=shakespeare_char")
	$(VENV)/bin/scalelab-data $(ARGS)

train: $(STAMP) ## Train the default experiment on the embedded defaults (ARGS="key=value ...")
	$(VENV)/bin/scalelab-train $(ARGS)

ui: $(STAMP) ## Start the MLflow UI on 127.0.0.1; prints one link, to the newest experiment's runs
	$(PY) -m scalelab.tracking.ui $(ARGS)

sweep-plan: $(STAMP) ## Print the scaling-sweep plan without running it
	$(VENV)/bin/scalelab-sweep --plan-only $(ARGS)

sweep: $(STAMP) ## Plan, run, fit and report a scaling-law sweep (default sweep=cpu_small)
	$(VENV)/bin/scalelab-sweep $(ARGS)

fit: $(STAMP) ## Refit scaling laws from a sweep's MLflow runs or a CSV (ARGS="--csv file.csv")
	$(VENV)/bin/scalelab-fit $(ARGS)

bench: $(STAMP) ## Training bench: reference vs model vs platform in turns (ARGS="--full", "--compare DIR")
	$(PY) -m benchmarks $(ARGS)

gpu-check: $(STAMP) ## On a GPU machine: real 1-GPU FSDP train + checkpoint round trip (< 5 min)
	$(PY) scripts/gpu_check.py $(ARGS)

cluster-up: ## Start a single-node SLURM + an MLflow server on PostgreSQL (root; docs/cluster.md)
	@bash scripts/cluster_up.sh

cluster-down: ## Stop what cluster-up started (ARGS=--purge also deletes its folder)
	@bash scripts/cluster_down.sh $(ARGS)

clean: ## Remove caches only (runs, checkpoints and the MLflow store stay; see clean-runs)
	rm -rf .pytest_cache .ruff_cache build
	find . -name __pycache__ -type d -prune -not -path "./$(VENV)/*" -exec rm -rf {} +

clean-runs: ## Delete outputs/ and multirun/ (run folders, checkpoints included) after listing them; YES=1 skips the question
	@dirs=$$(for d in outputs multirun; do [ -d $$d ] && echo $$d; done); \
	if [ -z "$$dirs" ]; then echo "no outputs/ or multirun/: nothing to delete"; exit 0; fi; \
	du -sh $$dirs; \
	echo "deletes these run folders and their checkpoints; keeps mlruns.db, mlartifacts/, sweeps/, optuna.db, data_cache/"; \
	if [ "$(YES)" = 1 ]; then a=y; else read -r -p "delete them? [y/N] " a || a=n; fi; \
	if [ "$$a" = y ]; then rm -rf outputs multirun && echo deleted; else echo "nothing deleted"; fi

.PHONY: help install test test-all test-deps lint format model-summary data train ui sweep-plan sweep fit bench gpu-check cluster-up cluster-down clean clean-runs
