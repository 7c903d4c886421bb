# The two commands: `make demo` and `make test`. Both set everything up on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_ADDR ?= 127.0.0.1:8000
DATASET ?= ../shared/datasets/nfcorpus
SCALES ?= 10k,100k
# The embedder of `make bench-quality`: empty for the settings' default (hashing), or
# wordllama, hashing, or a backend's dotted path.
EMBEDDER ?=

.PHONY: install install-django6 demo test test-django6 stress lint format migrations-check bench bench-quality bench-embedders screenshots bench-serving dist check-install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Migrate, seed the demo data, print the agent credentials and serve on $(DEMO_ADDR).
demo: $(STAMP)
	cd example_project && ../$(PY) manage.py demo --addr $(DEMO_ADDR)

## The whole test suite, on the embedded PostgreSQL unless DATABASE_URL is set.
test: $(STAMP)
	$(PY) -m pytest

# The suite under Django 6, which needs Python 3.12+: a virtualenv of its own, on the newer
# Python scripts/newer_python.py finds, or builds into .data/python on first use.
VENV6 ?= .venv-django6
PY6 := $(VENV6)/bin/python
STAMP6 := $(VENV6)/.installed

$(STAMP6): pyproject.toml
	python=$$($(PYTHON) scripts/newer_python.py .data/python) && "$$python" -m venv $(VENV6)
	$(PY6) -m pip install --quiet --upgrade pip
	$(PY6) -m pip install --quiet -e '.[dev]' 'Django>=6,<7'
	touch $(STAMP6)

## The Django 6 virtualenv alone (and its interpreter, built if missing): CI prepares it while
## the first suite runs.
install-django6: $(STAMP6)

## The whole test suite again under the latest Django 6.x (CI runs both).
test-django6: $(STAMP6)
	$(PY6) -m pytest

## The fault and fuzz suite in its long form (a few minutes): hostile input, forged references,
## schema fuzzing, a frozen and a restarted database, re-ingestion under load. Prints one line
## per figure: `STRESS <name> <value> <limit> PASS|FAIL`.
stress: $(STAMP)
	BAILING_STRESS=1 $(PY) -m pytest tests/faults -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

## The two wheels in dist/: bailing-knowledge (the app) and bailing-knowledge-client (the
## HTTP client, tool definitions and MCP server, without Django).
dist: $(STAMP)
	$(PY) -m pip wheel --quiet --no-deps -w dist .
	$(PY) scripts/build_client_dist.py dist

## Both wheels in fresh virtualenvs, as a new team uses them: startproject, a PostgreSQL role
## that is not a superuser, migrate, ingest, search and read over HTTP, the client's MCP server.
check-install: $(STAMP)
	$(PY) scripts/check_install.py

## Latency and throughput against their targets (TARGET lines): search, read, ingestion.
## SCALES=10k,100k,1m adds 1M chunks. Builds the databases on first use, then reuses them.
bench: $(STAMP)
	$(PY) -m benchmarks.perf --scales $(SCALES)

## Search through an HTTP server (runserver, gunicorn, granian) at 8 and 32 keep-alive
## clients, as docs/deployment.md publishes it. Needs wrk (apt-get install wrk).
bench-serving: $(STAMP)
	$(PY) -m pip install --quiet -e '.[deploy]'
	$(PY) -m benchmarks.serving

## Retrieval quality (nDCG@10, QUALITY lines) of lexical, vector and hybrid search on a BEIR
## set, and the lexical leg's exactness against an exhaustive BM25 (a TARGET line).
## EMBEDDER=wordllama runs it with the WordLlama embedder.
bench-quality: $(STAMP)
	$(PY) -m benchmarks.quality $(DATASET) $(if $(EMBEDDER),--embedder $(EMBEDDER))

## Load time, chunks/s, query latency and memory of the local embedders (hashing, WordLlama).
bench-embedders: $(STAMP)
	$(PY) -m benchmarks.embedding $(DATASET)

## The admin in headless Chromium at 1400 px: the lists must fit the window, and the
## screenshots in docs/images are taken again. Skipped when Chromium or ChromeDriver is absent
## (Debian: apt-get install chromium chromium-driver).
screenshots: $(STAMP)
	BK_SCREENSHOTS=docs/images $(PY) -m pytest -m browser -q -rs tests/test_admin_browser.py

clean:
	rm -rf $(VENV) $(VENV6) .data .pytest_cache .ruff_cache .hypothesis dist build
