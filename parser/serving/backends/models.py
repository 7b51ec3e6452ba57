"""`Models`: the backends a method runs on, built once from the `models` config section.

    models = build_models({"lead": {"_target_": "parser.serving.backends.transformers.TransformersBackend.from_config",
                                    "model": "tiny-qwen3.5"},
                           "subagent": {"same_as": "lead"}})

ParSer uses both roles; full-context and MemAgent use only `lead`; agentic RAG and the chunk
orders of the sequential methods (`parser.engine.scorers`) use `embedder` where the config has one.
Tokenizers are HF tokenizers with a chat template (the engine renders prompts itself).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping


@dataclasses.dataclass
class Models:
    lead: Any  # Backend
    lead_tokenizer: Any
    subagent: Any = None  # Backend (often the gateway)
    subagent_tokenizer: Any = None
    embedder: Any = None  # callable list[str] -> np.ndarray (L2-normalised rows): agentic RAG, chunk orders

    closed: bool = dataclasses.field(default=False, init=False, repr=False)

    async def aclose(self) -> None:
        """Close each backend once (safe to call again: the method and its caller may both close)."""
        if self.closed:
            return
        self.closed = True
        for backend in {id(b): b for b in (self.lead, self.subagent) if b is not None}.values():
            await backend.aclose()


def build_models(cfg: Mapping[str, Any]) -> Models:
    """The `Models` bundle a method runs on. `subagent: {same_as: lead}` shares one backend."""
    from parser.serving.backends import build_backend

    if "lead" not in cfg:
        raise ValueError("models config: missing the 'lead' section")
    lead, lead_tokenizer = build_backend(cfg["lead"], where="models.lead")
    _require_chat_template("lead", cfg["lead"], lead_tokenizer)
    sub_cfg = cfg.get("subagent") or {"same_as": "lead"}
    if sub_cfg.get("same_as") == "lead":
        subagent, subagent_tokenizer = lead, lead_tokenizer
    else:
        subagent, subagent_tokenizer = build_backend(sub_cfg, where="models.subagent")
        _require_chat_template("subagent", sub_cfg, subagent_tokenizer)
    embedder = None
    if cfg.get("embedder"):
        from parser.serving.backends.embedder import LazyEmbedder

        embedder = LazyEmbedder(cfg["embedder"])  # loaded by the first method that embeds
    return Models(lead, lead_tokenizer, subagent, subagent_tokenizer, embedder)


def _require_chat_template(role: str, cfg: Mapping[str, Any], tokenizer: Any) -> None:
    """Every prompt a method renders for a role is chat turns. Without a template transformers
    fails at the first episode, far from the config that named the model (e.g. the packaged
    Gemma 3 270M: a base model, whose GGUF carries no template). Backends open nothing before
    their first request, so refusing here leaves nothing to close."""
    if not getattr(tokenizer, "chat_template", None):
        name = cfg.get("model") or cfg.get("tokenizer")
        raise ValueError(f"models.{role}: {name!r} has a tokenizer without a chat template (a base model, not an "
                         "instruct one?); the lead and the subagents are prompted in chat turns")
