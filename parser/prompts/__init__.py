"""Prompts as data: versioned template files, loaded by name.

Each version lives in its own folder (`v1/`); a change that alters model behaviour gets a new
folder, so results files can say which prompts produced them (`PROMPT_VERSION`). Templates
are `str.format` strings; the fields each one takes are listed in `FIELDS`.

Ordering rule for the subagent prompt: fixed instructions -> its chunk -> the query, so that
instructions+chunk is an identical prefix across rounds (SGLang RadixCache / the CPU backend's
prefix cache reuse it). Keep the instructions short next to a chunk: the router's cache-aware
policy compares prefix match against a fraction of the whole text.

The lead agent's prompts hold the question only: the lead must never see document text.
"""
from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

DEFAULT_VERSION = "v1"

FIELDS = {
    "lead_system": set(),
    "lead_user": {"question"},
    "subagent": {"chunk", "query"},
    "invalid_action": set(),
    "finding": {"agent", "answer", "evidence"},
    "observation": {"query", "num_findings", "num_agents", "findings"},
    "observation_empty": {"query", "num_agents"},
    "omitted": {"count"},
    # engine turns that only eval-time options use (`EpisodeConfig.continue_cut_turns`,
    # `finalize_turn`, `compact_after_chars`); every tool set shares them
    "continue": set(),
    "finalize": set(),
    "compacted": set(),
    # for chat templates that ignore `tools=` (e.g. SmolLM2's): the tool list and call format,
    # appended to the system prompt so such models can still call tools
    "tool_format_fallback": {"tools"},
}


@functools.lru_cache(maxsize=None)
def load_template(name: str, version: str = DEFAULT_VERSION) -> str:
    if name not in FIELDS:
        raise KeyError(f"unknown prompt template {name!r}; known: {sorted(FIELDS)}")
    path = resources.files(__package__) / version / f"{name}.txt"
    if not path.is_file():
        raise FileNotFoundError(f"prompt template {name!r} missing for version {version!r}: {path}")
    return path.read_text(encoding="utf-8").rstrip("\n")


def render(name: str, version: str = DEFAULT_VERSION, **fields: Any) -> str:
    missing = FIELDS[name] - fields.keys()
    if missing:
        raise KeyError(f"prompt {name!r} ({version}) needs field(s) {sorted(missing)}")
    template = load_template(name, version)
    return template.format(**fields) if FIELDS[name] else template


@functools.lru_cache(maxsize=None)
def lead_tools(version: str = DEFAULT_VERSION) -> list[dict[str, Any]]:
    """The lead's one tool, as an OpenAI-style function schema for `apply_chat_template(tools=...)`."""
    path = resources.files(__package__) / version / "tools.json"
    return json.loads(path.read_text(encoding="utf-8"))
