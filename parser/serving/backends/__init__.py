"""Build one backend (and its tokenizer) from a config section.

    backend, tokenizer = build_backend({"type": "transformers", "model": "tiny-qwen3.5"})
    models = parser.serving.backends.models.build_models(cfg.models)      # the lead/subagent pair

Backend types: `transformers` (in-process, CPU default), `http` (SGLang / OpenAI servers, the
gateway; `base_urls: [...]` instead of `base_url` spreads chunks over several servers with a
`WorkerPool`), `sglang_engine` (in-process GPU). A model name is a hub name or a local path, or
one of the offline names registered under the `parser.models` entry-point group
(`parser.serving.backends.loading`).
"""
from __future__ import annotations

from typing import Any, Mapping

from parser.serving.types import Backend, BackendError, Completion, SamplingParams
from parser.serving.backends.loading import load_model_and_tokenizer, load_tokenizer

__all__ = ["Backend", "BackendError", "Completion", "SamplingParams", "build_backend", "load_model_and_tokenizer",
           "load_tokenizer"]

def build_backend(cfg: Mapping[str, Any], where: str = "models") -> tuple[Backend, Any]:
    """(backend, tokenizer) for one role's config section (`where` names it in errors)."""
    cfg = dict(cfg)
    kind = cfg.pop("type", None)
    if kind == "transformers":
        from parser.serving.backends.transformers import TransformersBackend

        model, tokenizer = load_model_and_tokenizer(cfg.pop("model"), **cfg.pop("model_kwargs", {}))
        return TransformersBackend(model, tokenizer, **cfg), tokenizer
    if kind == "http":
        return _http_backend(cfg, where)
    if kind == "sglang_engine":
        from parser.serving.backends.sglang_engine import SGLangEngineBackend

        tokenizer = load_tokenizer(cfg.get("tokenizer") or cfg["model"])
        cfg.pop("tokenizer", None)
        return SGLangEngineBackend(model_path=cfg.pop("model"), **cfg), tokenizer
    raise ValueError(f"backend config: unknown type {kind!r} (expected transformers, http or sglang_engine)")


def _http_backend(cfg: dict[str, Any], where: str) -> tuple[Backend, Any]:
    """A remote role, probed once before anything runs (`preflight: true`, the default;
    parser.serving.backends.preflight): a server that is down fails here naming its URL; `server: auto`
    becomes the dialect the server's software speaks; `tokenizer: null` the served model's."""
    from parser.serving.backends.http import HttpBackend
    from parser.serving.backends.loading import served_tokenizer_name
    from parser.serving.backends.preflight import ServerUnavailable, probe, resolve_server

    pooled = "base_urls" in cfg
    urls = list(cfg.pop("base_urls", None) or [cfg.pop("base_url", None)])
    if not all(isinstance(url, str) and url for url in urls):
        raise ValueError(f"{where}: an http backend needs base_url (or base_urls), got {urls!r}")
    api = cfg.get("api", "sglang")
    if cfg.pop("preflight", True):
        answers, down = [], []
        for url in urls:  # a pool fails over from a dead worker, so one answering worker is enough
            try:
                answers.append(probe(url, api, where))
            except ServerUnavailable as err:
                down.append(str(err))
        if not answers:
            raise ServerUnavailable("; ".join(down))
        for message in down:
            print(f"[parser] warning: {message.replace('; nothing was run', '')}; the pool fails its chunks over to the "
                  "workers that answer")
        info = answers[0]
    else:
        from parser.serving.backends.preflight import ServerInfo

        info = ServerInfo((), None)
    cfg["server"] = resolve_server(cfg.get("server", "sglang"), info)
    if cfg.get("model") is None and info.models and api != "sglang":
        cfg["model"] = info.models[0]
    tokenizer = load_tokenizer(served_tokenizer_name(cfg.pop("tokenizer", None), info.models, where), f"{where}.tokenizer")
    if pooled:  # several servers and no gateway: chunk-pinned, with failover
        from parser.serving.backends.pool import WorkerPool

        cooldown_s, hung_after_s = cfg.pop("cooldown_s", 5.0), cfg.pop("hung_after_s", 5.0)
        return WorkerPool([HttpBackend(url, **cfg) for url in urls], cooldown_s=cooldown_s,
                          hung_after_s=hung_after_s), tokenizer
    return HttpBackend(urls[0], **cfg), tokenizer
