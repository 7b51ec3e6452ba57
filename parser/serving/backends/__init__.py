"""Build one backend (and its tokenizer) from a config section, by its `_target_`.

    backend, tokenizer = build_backend({"_target_": TRANSFORMERS, "model": "tiny-qwen3.5"})
    models = parser.serving.backends.models.build_models(cfg.models)      # the lead/subagent pair

Targets (each returns `(backend, tokenizer)`; configs/backend/*.yaml): `TransformersBackend.from_config`
(in-process, CPU default), `parser.serving.backends.http_backend` (SGLang / OpenAI servers, the
gateway; `base_urls: [...]` instead of `base_url` spreads chunks over several servers with a
`WorkerPool`), `parser.serving.backends.sglang_engine_backend` (in-process GPU). The old
`type: transformers | http | sglang_engine` still builds for one release, with a FutureWarning.
A model name is a hub name or a local path, or one of the offline names registered under the
`parser.models` entry-point group (`parser.serving.backends.loading`).
"""
from __future__ import annotations

from typing import Any, Mapping

from parser.base.instantiate import build, with_target
from parser.base.redact import redact
from parser.serving.types import Backend, BackendError, Completion, SamplingParams
from parser.serving.backends.loading import load_model_and_tokenizer, load_tokenizer

__all__ = ["Backend", "BackendError", "Completion", "SamplingParams", "TRANSFORMERS", "TYPE_ALIASES", "build_backend", "http_backend",
           "in_process", "load_model_and_tokenizer", "load_tokenizer", "sglang_engine_backend"]

TRANSFORMERS = "parser.serving.backends.transformers.TransformersBackend.from_config"
# The old `type:` of a backend section -> its `_target_` (kept for one release).
TYPE_ALIASES = {"type": {"transformers": TRANSFORMERS,
                         "http": "parser.serving.backends.http_backend",
                         "sglang_engine": "parser.serving.backends.sglang_engine_backend"}}


def build_backend(cfg: Mapping[str, Any], where: str = "models") -> tuple[Backend, Any]:
    """(backend, tokenizer) for one role's config section (`where` names it in errors). A backend's
    `name` is its worker label (a method's is its config name), so it is passed on, not dropped."""
    name = {"name": cfg["name"]} if "name" in cfg else {}
    return build(cfg, where=where, aliases=TYPE_ALIASES, role=where, **name)


def in_process(cfg: Mapping[str, Any], where: str = "models") -> bool:
    """The section loads its model in this process through transformers (the demo's CPU budgets
    and its multi-worker mode ask this)."""
    return with_target(cfg, where=where, aliases=TYPE_ALIASES).get("_target_") == TRANSFORMERS


def sglang_engine_backend(model: str, *, tokenizer: str | None = None, role: str = "models",
                          **engine_kwargs: Any) -> tuple[Backend, Any]:
    """An in-process SGLang engine on this machine's GPU; `tokenizer` (default: the model's) renders prompts."""
    from parser.serving.backends.sglang_engine import SGLangEngineBackend

    return SGLangEngineBackend(model_path=model, **engine_kwargs), load_tokenizer(tokenizer or model, f"{role}.tokenizer")


def http_backend(*, base_url: str | None = None, base_urls: list[str] | None = None, role: str = "models",
                 preflight: bool = True, tokenizer: str | None = None, cooldown_s: float = 5.0,
                 hung_after_s: float = 5.0, **kwargs: Any) -> tuple[Backend, Any]:
    """A remote role, probed once before anything runs (`preflight: true`, the default;
    parser.serving.backends.preflight): a server that is down, failing, too slow or not serving
    `model` fails here naming its URL and the reason; `server: auto`
    becomes the dialect the server's software speaks; `tokenizer: null` the served model's.
    `base_urls`: a `WorkerPool` over several servers (`cooldown_s`, `hung_after_s` are its)."""
    from parser.serving.backends.http import HttpBackend
    from parser.serving.backends.loading import served_tokenizer_name
    from parser.serving.backends.preflight import ServerUnavailable, check_served, probe, resolve_server

    urls = list(base_urls or [base_url])
    if not all(isinstance(url, str) and url for url in urls):
        raise ValueError(f"{role}: an http backend needs base_url (or base_urls), got {redact(repr(urls))}")
    api = kwargs.get("api", "sglang")
    if preflight:
        answers, down = [], []
        for url in urls:  # a pool fails over from a dead worker, so one answering worker is enough
            try:
                answers.append(probe(url, api, role))
            except ServerUnavailable as err:
                down.append(str(err))
                continue
            if api != "sglang":  # a name the server does not list: every request would be a 404
                check_served(kwargs.get("model"), answers[-1], url, role)
        if not answers:
            raise ServerUnavailable("; ".join(down))
        for message in down:
            print(f"[parser] warning: {message.replace('; nothing was run', '')}; the pool fails its chunks over to the "
                  "workers that answer")
        info = answers[0]
    else:
        from parser.serving.backends.preflight import ServerInfo

        info = ServerInfo((), None)
    kwargs["server"] = resolve_server(kwargs.get("server", "sglang"), info)
    if kwargs.get("model") is None and info.models and api != "sglang":
        kwargs["model"] = info.models[0]
    tokenizer = load_tokenizer(served_tokenizer_name(tokenizer, info.models, role), f"{role}.tokenizer")
    if base_urls is not None:  # several servers and no gateway: chunk-pinned, with failover
        from parser.serving.backends.pool import WorkerPool

        return WorkerPool([HttpBackend(url, **kwargs) for url in urls], cooldown_s=cooldown_s,
                          hung_after_s=hung_after_s), tokenizer
    return HttpBackend(urls[0], **kwargs), tokenizer
