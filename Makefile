# cdclake: `make demo` runs the whole thing on the local stack; `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# uv installs the requirements (24 s on 2 cores from an empty cache, pip 57 s)
UV     := $(VENV)/bin/uv

.PHONY: venv demo test test-unit up down status lint clean bench

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { \
	  echo "python3 -m venv failed: install python3-venv (apt-get install python3-venv)"; exit 1; }
	$(PY) -m pip install --quiet --disable-pip-version-check uv==0.13.9
	$(UV) pip install --quiet --compile-bytecode --python $(PY) -r requirements-dev.txt
	$(UV) pip install --quiet --compile-bytecode --python $(PY) --no-deps -e .
	$(UV) pip check --quiet --python $(PY)
	@touch $(STAMP)

venv: $(STAMP)

demo: venv
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) scripts/demo.py

# three workers, each with a stack of its own, take a test file at a time (docs/testing.md)
TEST_WORKERS ?= 3
test: venv
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile \
		--no-loadscope-reorder

test-unit: venv
	$(PY) -m pytest tests/unit

up: venv
	$(PY) -m cdclake local up

down:
	@test -x $(PY) && $(PY) -m cdclake local down || true

status: venv
	$(PY) -m cdclake local status

SCALE ?= 1
bench: venv
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m cdclake bench --scale $(SCALE) \
		$(if $(BASELINE),--baseline $(BASELINE))

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

clean: down
	rm -rf .cdclake
