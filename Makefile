# The two commands: `make demo` and `make test`. Both set everything up on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_ADDR ?= 127.0.0.1:8000
DATASET ?= ../shared/datasets/nfcorpus

.PHONY: install demo test lint format migrations-check bench bench-quality clean

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

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

## Latency and throughput: full stack against raw SQL at 10k and 100k chunks, ingestion, read.
## Builds the benchmark databases on first use (a few minutes), then reuses them.
bench: $(STAMP)
	$(PY) -m benchmarks.perf

## Retrieval quality (nDCG@10, Recall@3) of lexical, vector and hybrid search on a BEIR set.
bench-quality: $(STAMP)
	$(PY) -m benchmarks.quality $(DATASET)

clean:
	rm -rf $(VENV) .data .pytest_cache .ruff_cache .hypothesis
