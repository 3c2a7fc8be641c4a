# make demo: set up and run the main chain on built-in defaults.  make test: set up and run the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.omrl-installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU torch first: a plain torch requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[train,dev]'
	touch $(STAMP)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

demo: $(STAMP)
	bash scripts/demo.sh

bench: $(STAMP)
	$(PY) benchmarks/store_bench.py --n 20000

clean:
	rm -rf demo-store runs .pytest_cache
