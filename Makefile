# meshyard: `make run` starts the service with a demo job; `make test` runs the test suite;
# `make check` is the edit loop (unit tests and lint, well under 2 minutes).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# Tests that start no Ray cluster, no multi-process torch job and no browser run two at a time
# (pytest-xdist, one module per worker); the others run one at a time after them: they keep
# both cores busy on their own (Ray and torch processes), and two of them side by side were no
# faster and more often late on their timeouts.
PARALLEL_TESTS := tests/unit tests/integration/store tests/integration/api
XDIST ?= -n 2 --dist loadfile

# Bytecode for the project's own modules. Every rank process, Ray worker and CLI run imports
# them; where PYTHONDONTWRITEBYTECODE is set (this machine's default) nothing caches the
# compiled modules and each process compiles them again (about 0.3 s of CPU per process, a
# few hundred processes a test run). Only changed files are compiled again.
SOURCES := meshyard orchestrator workers api tests bench examples migrations

.PHONY: run test check install lint bench clean bytecode

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[postgres,nvml,dev]"
	touch $@

install: $(VENV)/.installed

bytecode: $(VENV)/.installed
	$(PY) -m compileall -q -j 0 $(SOURCES) >/dev/null

run: bytecode
	$(VENV)/bin/meshyard serve --demo

test: bytecode
	status=0; \
	$(PY) -m pytest $(XDIST) $(PARALLEL_TESTS) $(PYTEST_ARGS) || status=$$?; \
	$(PY) -m pytest $(addprefix --ignore=,$(PARALLEL_TESTS)) --durations=30 $(PYTEST_ARGS) \
		|| status=$$?; \
	exit $$status

check: bytecode
	$(VENV)/bin/ruff check meshyard orchestrator workers api tests bench
	$(PY) -m pytest $(XDIST) -q tests/unit $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check meshyard orchestrator workers api tests bench

clean:
	rm -rf .meshyard .pytest_cache
