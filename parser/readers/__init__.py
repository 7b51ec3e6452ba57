"""Alternative chunk readers for ParSer (paper Table 5), beside the default `parser.reader.SubagentReader`.

They implement the same `ChunkReader` protocol, so the same lead agent and the one episode
engine coordinate them without retraining:

    from parser.readers import build_reader
    reader = build_reader({"type": "dci"}, models)     # or {"type": "thinking"}, {"type": "direct"}
    method = build_method("parser", models=models, episode=cfg, reader=reader)
"""
from __future__ import annotations

from typing import Any, Mapping

from parser.readers.dci import DCIReader
from parser.readers.thinking import ThinkingReader

__all__ = ["DCIReader", "ThinkingReader", "build_reader"]


def build_reader(cfg: Mapping[str, Any], models: Any) -> Any:
    """A reader over the subagent model from a config section (`type` + the reader's kwargs)."""
    cfg = dict(cfg)
    kind = cfg.pop("type", "direct")
    if kind == "direct":
        from parser.reader import SubagentReader

        return SubagentReader(models.subagent, models.subagent_tokenizer, **cfg)
    if kind == "thinking":
        return ThinkingReader(models.subagent, models.subagent_tokenizer, **cfg)
    if kind == "dci":
        return DCIReader(models.subagent, models.subagent_tokenizer, **cfg)
    raise ValueError(f"reader config: unknown type {kind!r} (expected direct, thinking or dci)")
