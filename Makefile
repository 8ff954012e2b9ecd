# pybench-eval: `make help` lists the targets.
#
# Images build with no registry and no network inside the build: a local Debian base (debootstrap +
# docker import) and wheelhouses downloaded on the host. Online, pass BASE_IMAGE=python:3.11-slim-bookworm
# (and REDIS_BASE_IMAGE=debian:bookworm-slim) to build from the usual public images instead.

SHELL := /bin/bash
PYTHON ?= python3
# The project's Python packages live in a virtual environment these targets make and use (nothing is installed
# into the host's Python); PY runs in it.
VENV ?= .venv
PY := $(abspath $(VENV))/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
LOCAL_BASE := pybench-eval/bookworm-base:latest
BASE_IMAGE ?= $(LOCAL_BASE)
REDIS_BASE_IMAGE ?= $(BASE_IMAGE)
PBE_SUITE_DIR ?= $(abspath ../shared/pybench)
# The build the manifests name: the project's version and the commit (".dirty" with uncommitted changes).
BUILD_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
BUILD_COMMIT := $(shell c=$$(git rev-parse --short=12 HEAD 2>/dev/null) && { git diff --quiet HEAD 2>/dev/null && echo $$c || echo $$c.dirty; } || echo unknown)
DOCKER_GID ?= $(shell stat -c %g /var/run/docker.sock 2>/dev/null || echo 999)
PBE_GATEWAY_PORT ?= 8080
DEMO_TASKS ?= 13,16,30,44,77,90,103,112,121,134,135
# The demo's model: replay (the suite's recorded trajectories) or smollm2 (a real model on CPU, profile smollm2).
MODEL ?= replay
ifeq ($(MODEL),smollm2)
export COMPOSE_PROFILES := smollm2
DEMO_ARGS ?= --model-url http://model:8000/v1 --model smollm2 --preflight --tasks 3,44,134 --max-tokens 256
else ifeq ($(MODEL),replay)
DEMO_ARGS ?= --tasks $(DEMO_TASKS)
else
$(error MODEL must be replay or smollm2, not $(MODEL))
endif
export PBE_SUITE_DIR DOCKER_GID PBE_GATEWAY_PORT BASE_IMAGE

COMPOSE := docker compose -p pybench-eval

.PHONY: help host-deps install compose-plugin base-image wheels images model-image k8s-tools real-model env up down demo test test-fast lint bench bench-sandbox bench-grading bench-throughput bench-lifecycle bench-dashboard bench-real-model reap

help: ## List the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-15s %s\n", $$1, $$2}'

host-deps: ## Check the host (Docker answers; debootstrap, python3-venv); as root, install what is missing
	@PYTHON=$(PYTHON) bash scripts/host-deps.sh docker venv $(if $(filter $(LOCAL_BASE),$(BASE_IMAGE)),debootstrap)

$(VENV)/.installed: pyproject.toml
	@PYTHON=$(PYTHON) bash scripts/host-deps.sh venv
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e .
	@touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $@

install: $(VENV)/.installed-dev ## Make the virtual environment .venv with the project and its development tools

compose-plugin: ## Install Compose v2 as a Docker CLI plugin where `docker compose` is missing
	@bash scripts/install-compose.sh

base-image: host-deps ## Make the local Debian bookworm base image (only when BASE_IMAGE is the local one)
	@if [ "$(BASE_IMAGE)" = "$(LOCAL_BASE)" ]; then bash scripts/make-base-image.sh $(LOCAL_BASE); fi

wheels: ## Download the images' Python packages into local wheelhouses (for Python 3.11.2)
	@test -f "$(PBE_SUITE_DIR)/sandbox-requirements.txt" || { echo "no suite at $(PBE_SUITE_DIR): set PBE_SUITE_DIR" >&2; exit 1; }
	@cmp -s "$(PBE_SUITE_DIR)/sandbox-requirements.txt" services/sandbox/image/staged/suite-requirements.txt \
	  || cp "$(PBE_SUITE_DIR)/sandbox-requirements.txt" services/sandbox/image/staged/suite-requirements.txt
	@bash scripts/stage-wheels.sh services/sandbox/image/staged/wheels \
	  -r services/sandbox/image/kernel-requirements.txt -r services/sandbox/image/staged/suite-requirements.txt
	@bash scripts/stage-wheels.sh staged/wheels -r requirements-app.txt

images: base-image wheels ## Build the app, sandbox and redis images (layers are reused when nothing changed)
	docker build -q --force-rm --build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg BUILD_VERSION=$(BUILD_VERSION) \
	  --build-arg BUILD_COMMIT=$(BUILD_COMMIT) -t pybench-eval/app:latest .
	docker build -q --force-rm --build-arg BASE_IMAGE=$(BASE_IMAGE) -t pybench-eval/sandbox:latest services/sandbox/image
	docker build -q --force-rm --build-arg BASE_IMAGE=$(REDIS_BASE_IMAGE) -t pybench-eval/redis:latest docker/redis

model-image: $(VENV)/.installed base-image ## Build the image of the real model's server (profile smollm2; compiles llama.cpp once)
	@PYTHON=$(PY) bash scripts/install-real-model.sh --model-only
	@bash scripts/stage-model-image.sh
	docker build -q --force-rm --build-arg BASE_IMAGE=$(BASE_IMAGE) -t pybench-eval/llama:latest docker/llama

k8s-tools: ## Install checkov and kubernetes-validate (a venv each under var/tools) for the k8s/ manifest tests
	@PYTHON=$(PYTHON) bash scripts/install-k8s-tools.sh

real-model: $(VENV)/.installed-dev ## Install llama.cpp's server (compiles once, ~3.5 min) and SmolLM2-135M-Instruct
	@PYTHON=$(PY) bash scripts/install-real-model.sh

env: ## Make .env hold the stack's secrets (admin API key, Redis password), each only where it is missing
	@PYTHON=$(PYTHON) bash scripts/env-file.sh .env

up: images $(if $(filter smollm2,$(MODEL)),model-image) compose-plugin env ## Start the stack (gateway on 127.0.0.1:$PBE_GATEWAY_PORT) and wait until healthy
	$(COMPOSE) up -d --no-build --wait --wait-timeout 180
	@echo "pybench-eval is up: http://127.0.0.1:$(PBE_GATEWAY_PORT) (API docs at /docs; the admin key is in .env)"

down: env ## Stop the stack and remove its sandboxes (volumes are kept)
	-$(COMPOSE) --profile smollm2 --profile vllm down --remove-orphans
	@$(MAKE) --no-print-directory reap

demo: up $(VENV)/.installed ## Run ten PyBench tasks against the replay model and print the verdicts; leaves the stack up
	set -a; . ./.env; set +a; $(PY) scripts/demo.py --gateway http://127.0.0.1:$(PBE_GATEWAY_PORT) $(DEMO_ARGS)
	@echo "the stack is still up at http://127.0.0.1:$(PBE_GATEWAY_PORT) (dashboard: /dashboard); stop it with: make down"

test: host-deps $(VENV)/.installed-dev compose-plugin k8s-tools ## Run the tests (unit, real Redis, sandboxes, compose, a real model)
	@PYTHON=$(PYTHON) bash scripts/host-deps.sh redis-server chromium chromedriver
	@# The images build (mostly downloads and Docker) while llama.cpp compiles.
	$(MAKE) --no-print-directory -j2 images real-model
	$(PY) -m pytest

FAST_TESTS ?= not docker and not compose and not slow and not real_model and not chaos
FAST_WORKERS ?= 2
test-fast: $(VENV)/.installed-dev ## Run the tests that need no container, compose stack or real model (about 2 minutes)
	@PYTHON=$(PYTHON) bash scripts/host-deps.sh redis-server chromium chromedriver
	$(PY) -m pytest -n $(FAST_WORKERS) -m "$(FAST_TESTS)"

bench: bench-sandbox bench-grading ## Run every benchmark (each prints a table, then one JSON line)

bench-sandbox: images $(VENV)/.installed-dev ## Sandbox figures: cold start vs bare docker run, warm hand-out, cell round trip vs nbclient
	$(PY) scripts/bench_sandbox.py

bench-grading: images $(VENV)/.installed-dev ## Grading figures: every suite task graded (both gradings, checks in grading sandboxes)
	$(PY) scripts/bench_grading.py --suite $(PBE_SUITE_DIR)

bench-throughput: up $(VENV)/.installed-dev ## All 143 tasks through the stack (instant and 2 s model) against PyBench's unisolated way (root)
	set -a; . ./.env; set +a; $(PY) scripts/bench_throughput.py --suite $(PBE_SUITE_DIR)

bench-real-model: $(VENV)/.installed-dev ## All 143 tasks against SmolLM2 under llama.cpp in the stack, the judge on the same server (about an hour)
	$(MAKE) --no-print-directory up MODEL=smollm2
	set -a; . ./.env; set +a; $(PY) scripts/bench_real_model.py $(BENCH_ARGS)

bench-lifecycle: images $(VENV)/.installed-dev ## A session's CPU and wall time phase by phase outside its cells (start, kernel, teardown, grading sandbox)
	$(PY) scripts/bench_lifecycle.py

bench-dashboard: $(VENV)/.installed-dev ## Dashboard server time: a 143-task evaluation page, a task page of 10 turns and 10 charts
	@PYTHON=$(PYTHON) bash scripts/host-deps.sh redis-server
	$(PY) scripts/bench_dashboard.py --suite $(PBE_SUITE_DIR)

lint: $(VENV)/.installed-dev ## ruff and mypy
	$(PY) -m ruff check services gateway executor grader replay tests scripts
	$(PY) -m mypy

REAP_AGE ?= 0
reap: $(VENV)/.installed ## Remove leftover sandboxes and grading sandboxes (containers, volumes) older than REAP_AGE s (default: all)
	@$(PY) -m executor.reap --older-than $(REAP_AGE)
	@$(PY) -m grader.reap --older-than $(REAP_AGE)
