"""Chunk readers for ParSer, built from the `reader` section of a method config.

Every reader implements `parser.engine.tools.ChunkReader` (read, forget, close), so the same lead
agent and the one episode engine coordinate any of them without retraining:

    reader = build_reader({"type": "subagent"}, models)   # the paper's frozen subagent (subagent.py)
    reader = build_reader({"type": "thinking", "max_new_tokens": 4096}, models)   # Table 5 (thinking.py)
    reader = build_reader({"type": "dci", "episode": episode_section("dci_reader", max_turns=4)}, models)   # Table 5 (dci.py)
    python -m eval.run method=parser_dci                  # configs/method/parser_dci.yaml
"""
from __future__ import annotations

from typing import Any, Mapping

from parser.engine.readers.dci import DCIReader
from parser.engine.readers.subagent import SubagentReader
from parser.engine.readers.thinking import ThinkingReader

__all__ = ["DCIReader", "SubagentReader", "ThinkingReader", "build_reader", "reader_for_episode", "READER_TYPES"]

READER_TYPES = ("subagent", "thinking", "dci")


def reader_for_episode(cfg: Mapping[str, Any] | None, models: Any, episode: Any, protocol: Any) -> Any:
    """`build_reader`, with the episode config's subagent settings (temperature, reply budget,
    prompt version, JSON constraint) and the episode's protocol object (whose subagent prompt)
    as the default subagent's defaults. Eval (`ParSerMethod`) and training (the verl agent loop)
    both build their reader here, so the two cannot drift."""
    cfg = dict(cfg or {})
    protocol.check_reader(cfg.get("type", "subagent"))
    if cfg.get("type", "subagent") == "subagent":
        cfg = {"temperature": episode.subagent_temperature, "max_new_tokens": episode.subagent_max_tokens,
               "prompt_version": episode.prompt_version, "protocol": protocol,
               "json_constrained": episode.constrain_subagents, **cfg}
    return build_reader(cfg, models)


def build_reader(cfg: Mapping[str, Any], models: Any) -> Any:
    """A reader over the subagent model from a config section (`type` + the reader's kwargs)."""
    cfg = dict(cfg)
    kind = cfg.pop("type", "subagent")
    if kind == "subagent":
        return SubagentReader(models.subagent, models.subagent_tokenizer, **cfg)
    if kind == "thinking":
        return ThinkingReader(models.subagent, models.subagent_tokenizer, **cfg)
    if kind == "dci":
        return DCIReader(models.subagent, models.subagent_tokenizer, **cfg)
    raise ValueError(f"reader config: unknown type {kind!r} (expected one of {', '.join(READER_TYPES)})")
