# Two commands do all set-up on a fresh machine: `make demo` and `make test` (see README).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test bench install clean

# The Makefile is a prerequisite too: a change of what it installs (Meta-World below) reinstalls existing venvs.
$(STAMP): pyproject.toml constraints.txt scripts/system_deps.sh Makefile
	@bash scripts/system_deps.sh
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing dmrl into $(VENV) (torch pinned by constraints.txt)"
	@$(PY) -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
	@$(PY) -m pip install -q -c constraints.txt -e ".[dev]" 2>&1 | grep -v '^WARNING: Location' ; \
	  test $${PIPESTATUS[0]} -eq 0
	@# Meta-World 3.1.1 pins mujoco 3.3.0; dmrl runs MuJoCo 4 (envs/suites/metaworld_compat.py), and its
	@# run-time imports are in the `suites` extra, so it goes in without its own pins.
	@$(PY) -m pip install -q --no-deps metaworld==3.1.1 2>&1 | grep -v '^WARNING: Location' ; \
	  test $${PIPESTATUS[0]} -eq 0
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dmrl demo --out outputs/demo

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/ruff format --check src tests benchmarks scripts
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/env_speed.py

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache
