# meshyard: `make run` starts the service with a demo job; `make test` runs the test suite;
# `make check` is the edit loop (unit tests and lint, well under 2 minutes).
VENV ?= .venv
PY := $(VENV)/bin/python
# The interpreter the virtual environment is made from (`make install PYTHON=...` picks
# another): the distribution's /usr/bin/python3 where it is 3.11 or newer and can make a
# venv, else the first python3 on PATH. Debian's and Ubuntu's CPython are built with
# profile-guided and link-time optimization and link libpython into the executable; pyenv's
# default build does neither and spends 10-20 % more CPU on Python work here, in every
# one of the few thousand processes a test run starts (bench/README.md, "The interpreter").
PYTHON ?= $(shell /usr/bin/python3 -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && echo /usr/bin/python3 || echo python3)
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# The suite runs on three pytest-xdist workers, one test module at a time each (a module's
# fixtures start once). The modules that share a package's Ray cluster go to one worker as
# one unit (tests/conftest.py, XDIST_GROUPS), so that cluster starts once in the run, and the
# groups start first (the longest units). Two workers take the scenarios; the third, the
# filler, takes the modules that start no Ray and no torch.distributed job (tests/conftest.py,
# FILLER_FOLDERS) at nice MESHYARD_TEST_FILLER_NICE (10 unless set; Ray runs its own worker
# processes at nice 15), so it uses the CPU the scenarios leave idle while they wait out
# thresholds and polls (bench/README.md, "Three workers"). `make check` runs the unit tests
# on two workers (CHECK_XDIST).
XDIST ?= -n 3 --dist loadfile --no-loadscope-reorder
CHECK_XDIST ?= -n 2 --dist loadfile --no-loadscope-reorder

# Bytecode for the project's own modules. Every rank process, Ray worker and CLI run imports
# them; where PYTHONDONTWRITEBYTECODE is set (this machine's default) nothing caches the
# compiled modules and each process compiles them again (about 0.3 s of CPU per process, a
# few hundred processes a test run). Only changed files are compiled again.
SOURCES := meshyard orchestrator workers api tests bench examples migrations

.PHONY: run test check install lint bench clean bytecode lab-up lab-down lab-status

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[postgres,nvml,lightning,hf,dev]"
	touch $@

install: $(VENV)/.installed

bytecode: $(VENV)/.installed
	$(PY) -m compileall -q -j 0 $(SOURCES) >/dev/null

run: bytecode
	$(VENV)/bin/meshyard serve --demo

test: bytecode
	$(PY) -m pytest $(XDIST) --durations=30 $(PYTEST_ARGS)

check: bytecode
	$(VENV)/bin/ruff check meshyard orchestrator workers api tests bench
	$(PY) -m pytest $(CHECK_XDIST) -q tests/unit $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check meshyard orchestrator workers api tests bench

# A multi-host Ray cluster on this machine (root): LAB_HOSTS network namespaces on the
# 198.18.0.0/24 test range, Ray started through deploy/baremetal/ray-node.sh (deploy/lab/README.md).
LAB_HOSTS ?= 3
lab-up: $(VENV)/.installed
	$(PY) deploy/lab/lab.py up --hosts $(LAB_HOSTS)

lab-status:
	$(PY) deploy/lab/lab.py status

lab-down:
	$(PY) deploy/lab/lab.py down

clean:
	rm -rf .meshyard .pytest_cache
