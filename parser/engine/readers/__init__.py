"""Chunk readers for ParSer, built from the `reader` section of a method config by its `_target_`.

Every reader implements `parser.engine.tools.ChunkReader` (read, forget, close), so the same lead
agent and the one episode engine coordinate any of them without retraining:

    reader = build_reader({}, models)   # the paper's frozen subagent (subagent.py), the default
    reader = build_reader({"_target_": "parser.engine.readers.ThinkingReader", "max_new_tokens": 4096}, models)   # Table 5
    reader = build_reader({"_target_": "parser.engine.readers.DCIReader",
                           "episode": episode_section("dci_reader", max_turns=4)}, models)   # Table 5 (dci.py)
    parser eval method=parser_dci                  # configs/method/parser_dci.yaml

A reader class says which `kind` it is (the protocol refuses a kind it has no rules for) and which
of its settings come from the episode config (`episode_defaults`). The old `type: subagent |
thinking | dci` still builds for one release, with a FutureWarning.
"""
from __future__ import annotations

from typing import Any, Mapping

from parser.base.instantiate import build, locate, with_target
from parser.engine.readers.dci import DCIReader
from parser.engine.readers.subagent import SubagentReader
from parser.engine.readers.thinking import ThinkingReader

__all__ = ["DCIReader", "SubagentReader", "ThinkingReader", "build_reader", "reader_for_episode", "TYPE_ALIASES"]

DEFAULT = "parser.engine.readers.SubagentReader"
# The old `type:` of a reader section -> its `_target_` (kept for one release).
TYPE_ALIASES = {"type": {"subagent": DEFAULT, "thinking": "parser.engine.readers.ThinkingReader",
                         "dci": "parser.engine.readers.DCIReader"}}


def reader_for_episode(cfg: Mapping[str, Any] | None, models: Any, episode: Any, protocol: Any) -> Any:
    """`build_reader`, with the reader's `episode_defaults` (for the subagent: the episode config's
    temperature, reply budget, prompt version, JSON constraint and protocol) under the section's
    own keys. Eval (`ParSerMethod`) and training (the verl agent loop) both build their reader
    here, so the two cannot drift."""
    cfg = with_target(cfg or {}, where="reader", aliases=TYPE_ALIASES, default=DEFAULT)
    reader = locate(cfg["_target_"], where="reader")
    protocol.check_reader(reader.kind)
    return build_reader({**reader.episode_defaults(episode, protocol), **cfg}, models)


def build_reader(cfg: Mapping[str, Any], models: Any) -> Any:
    """A reader over the subagent model from a config section (`_target_` + the reader's kwargs;
    none: the subagent reader)."""
    cfg = with_target(cfg, where="reader", aliases=TYPE_ALIASES, default=DEFAULT)
    return build(cfg, where="reader", backend=models.subagent, tokenizer=models.subagent_tokenizer)
