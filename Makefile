# Quick start: `make demo` and `make test` on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch 2.13.0's CPU wheel is what the worker-helper tests run against.
TORCH  ?= torch==2.13.0
# Test processes run side by side: most tests wait on real processes and servers,
# so three share two cores well (PYTEST_WORKERS=0 runs them one after another).
# Work stealing (--dist worksteal) ends sooner here but runs the long e2e tests
# all at once, and the tests that wait on real processes then miss their deadlines.
# Instead each process is handed a few tests at a time (--maxschedchunk), the long
# ones (marked slow) first, so that none is left to run alone at the end.
PYTEST_WORKERS ?= 3
PYTEST_CHUNK   ?= 2

.PHONY: demo test lint unit contract e2e containers reliability soak bench schema screenshot servers clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.base: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e . --config-settings editable_mode=compat
	touch $@

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]' --config-settings editable_mode=compat
	$(BIN)/pip install -q '$(TORCH)'
	touch $@

demo: $(VENV)/.base
	$(BIN)/allocator demo --policy config/policy.example.yaml

lint: $(VENV)/.dev
	$(BIN)/ruff check allocator tests bench
	$(BIN)/ruff format --check allocator tests bench
	$(BIN)/mypy --strict allocator
	$(BIN)/lint-imports --no-cache
	site=$$(mktemp -d) && NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict \
		--site-dir "$$site"; status=$$?; rm -rf "$$site"; exit $$status

# Debian's etcd, docker-compose, openssl, chromium, zsh, podman, busybox-static and
# systemd (systemd-analyze), installed with apt-get when missing.
servers:
	tools/install-test-servers

test: servers lint
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --maxschedchunk $(PYTEST_CHUNK)

unit: $(VENV)/.dev
	$(BIN)/pytest -q tests/unit

contract: servers $(VENV)/.dev
	$(BIN)/pytest -q tests/contract

e2e: servers $(VENV)/.dev
	$(BIN)/pytest -q tests/e2e

# Workers in containers under a real podman (also part of `make test`).
containers: servers $(VENV)/.dev
	$(BIN)/pytest -q -m container tests

reliability: servers $(VENV)/.dev
	$(BIN)/pytest -q tests/reliability

# The reliability suite at its long sizes; prints the figures at the end.
soak: servers $(VENV)/.dev
	ALLOCATOR_SOAK=1 $(BIN)/pytest -q -p no:cacheprovider tests/reliability

# Every row of the speed table (docs/performance.md); writes bench/results.json.
# BENCH_ARGS=--quick for shorter windows, --only cli,agent,fleet for some rows.
bench: servers $(VENV)/.dev
	$(BIN)/python -m bench.run $(BENCH_ARGS)

schema: $(VENV)/.base
	$(BIN)/allocator policy schema > config/policy.schema.json

# The manual's pictures of the status page (docs/operations.md: 2 and 25,000 hosts), taken by its browser tests.
screenshot: servers $(VENV)/.dev
	ALLOCATOR_SCREENSHOT=docs $(BIN)/pytest -q -s tests/e2e/test_serve_page.py \
		tests/e2e/test_serve_page_panels.py -k "two_hosts or fleet"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
