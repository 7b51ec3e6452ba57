"""The baselines' prompts, as data: `parser/prompts/baselines/<version>/<name>.txt` + `tools.json`.

Kept apart from the lead's `parser/prompts/v1/` so a change to a baseline prompt never changes
ParSer's prompt version (and the other way round). Templates are `str.format` strings. The
engine's own turns (continuation, finalize, compaction placeholder) are in `parser.prompts`.

    render("memagent_update", question=q, memory=m, chunk=c)
"""
from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

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


def _folder(version: str) -> Any:
    return resources.files("parser.prompts") / "baselines" / version


@functools.lru_cache(maxsize=None)
def load(name: str, version: str = DEFAULT_VERSION) -> str:
    if name not in FIELDS:
        raise KeyError(f"unknown baseline prompt {name!r}; known: {sorted(FIELDS)}")
    path = _folder(version) / f"{name}.txt"
    if not path.is_file():
        raise FileNotFoundError(f"baseline prompt {name!r} missing for version {version!r}: {path}")
    return path.read_text(encoding="utf-8").rstrip("\n")


def render(name: str, version: str = DEFAULT_VERSION, **fields: Any) -> str:
    missing = FIELDS[name] - fields.keys()
    if missing:
        raise KeyError(f"baseline prompt {name!r} ({version}) needs field(s) {sorted(missing)}")
    return load(name, version).format(**fields)


@functools.lru_cache(maxsize=None)
def _tools(version: str) -> dict[str, Any]:
    return json.loads((_folder(version) / "tools.json").read_text(encoding="utf-8"))


def tools(*names: str, version: str = DEFAULT_VERSION) -> list[dict[str, Any]]:
    """OpenAI-style function schemas for `apply_chat_template(tools=...)`."""
    known = _tools(version)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KeyError(f"no tool schema for {unknown} in prompts/baselines/{version}/tools.json; known: {sorted(known)}")
    return [known[n] for n in names]
