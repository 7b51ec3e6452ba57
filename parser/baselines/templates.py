"""The baselines' prompts, as data: `parser/prompts/baselines/<version>/<name>.txt` + `tools.json`.

Kept apart from the lead's `parser/prompts/v1/` so a change to a baseline prompt never changes
ParSer's prompt version (and the other way round). Templates are `str.format` strings. The
engine's own turns (continuation, finalize, compaction placeholder) are in `parser.prompts`.

    render("memagent_update", question=q, memory=m, chunk=c)
"""
from __future__ import annotations

from typing import Any

from parser.prompts import PromptSet

DEFAULT_VERSION = "v1"

FIELDS = {
    "full_context_user": {"context", "question"},
    "full_context_followup": set(),
    "memagent_update": {"question", "memory", "chunk"},
    "memagent_final": {"question", "memory"},
    "rememr1_update": {"question", "memory", "recalled_memory", "chunk"},
    "rememr1_final": {"question", "memory", "recalled_memory"},
    "rag_system": set(),
    "rag_user": {"question"},
    "dci_system": set(),
    "dci_user": {"question"},
    "dci_subagent_system": set(),
    "dci_subagent_user": {"query"},
    "invalid_action": {"error"},
}


BASELINES = PromptSet("baselines", FIELDS)


def load(name: str, version: str = DEFAULT_VERSION) -> str:
    return BASELINES.load(name, version)


def render(name: str, version: str = DEFAULT_VERSION, **fields: Any) -> str:
    return BASELINES.render(name, version, **fields)


def tools(*names: str, version: str = DEFAULT_VERSION) -> list[dict[str, Any]]:
    """OpenAI-style function schemas for `apply_chat_template(tools=...)`."""
    known = BASELINES.tools(version)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KeyError(f"no tool schema for {unknown} in prompts/baselines/{version}/tools.json; known: {sorted(known)}")
    return [known[n] for n in names]
