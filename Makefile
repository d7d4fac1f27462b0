# Two entry points that work on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORKDIR ?= runs/demo
PIP_QUIET := --quiet --disable-pip-version-check --progress-bar off

.PHONY: demo test env bench clean

$(STAMP): setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install $(PIP_QUIET) --upgrade pip 2>&1 | grep -v "is ignored: it is neither" || true
	$(BIN)/pip install $(PIP_QUIET) -e '.[test]' 2>&1 | grep -v "is ignored: it is neither" || true
	$(BIN)/python -c "import matpo_jax, jax, flax, torch"
	touch $(STAMP)

env: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

demo: $(STAMP)
	$(BIN)/python -m matpo_jax.demo --workdir=$(WORKDIR)

bench: $(STAMP)
	$(BIN)/python benchmarks/sampler.py
	$(BIN)/python benchmarks/rollout.py
	$(BIN)/python benchmarks/train_step.py

clean:
	rm -rf $(VENV) runs
