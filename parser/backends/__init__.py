"""Build one backend (and its tokenizer) from a config section.

    backend, tokenizer = build_backend({"type": "transformers", "model": "tiny-qwen3.5"})
    models = parser.backends.models.build_models(cfg.models)      # the lead/subagent pair

Backend types: `transformers` (in-process, CPU default), `http` (SGLang / OpenAI servers, the
gateway; `base_urls: [...]` instead of `base_url` spreads chunks over several servers with a
`WorkerPool`), `sglang_engine` (in-process GPU). A model name is a hub name or a local path, or
one of the offline names registered under the `parser.models` entry-point group
(`parser.backends.loading`).
"""
from __future__ import annotations

from typing import Any, Mapping

from parser.backends.base import Backend, BackendError, Completion, SamplingParams
from parser.backends.loading import load_model_and_tokenizer, load_tokenizer

__all__ = ["Backend", "BackendError", "Completion", "SamplingParams", "build_backend", "load_model_and_tokenizer",
           "load_tokenizer"]

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
