"""Prompts as data: versioned template files, loaded by name.

Each version lives in its own folder (`v1/`); a change that alters model behaviour gets a new
folder, so results files can say which prompts produced them (`PROMPT_VERSION`). Templates
are `str.format` strings; the fields each one takes are listed in `FIELDS`.

A template is its file's text without the file's final line break: a template that must end in
a newline (MemAgent's and ReMemR1's end `Updated memory:\n`, as their authors send them) ends its
file with an empty line.

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
    "finding_cut": {"agent", "answer", "evidence"},  # a first finding longer than the whole budget, cut to fit
    "observation": {"query", "num_findings", "num_agents", "findings"},
    "observation_empty": {"query", "num_agents"},
    "omitted": {"count"},
    # engine turns that only the baselines' turn rules use (`parser.engine.tools.TurnRules`:
    # continue_cut_turns, finalize_turn, compact_after_chars); every tool set shares them
    "continue": set(),
    "finalize": set(),
    "compacted": set(),
    # the tool reply to a call past a turn's fan-out bound (max_tool_calls_per_turn,
    # max_subagent_requests_per_turn): the call is not run, and the lead is told why
    "call_not_run": {"made", "limit"},
    # for chat templates that ignore `tools=` (e.g. SmolLM2's): the tool list and call format,
    # appended to the system prompt so such models can still call tools
    "tool_format_fallback": {"tools"},
}


class PromptSet:
    """Versioned `str.format` templates in one folder of a package, with their fields declared.

    The lead/engine prompts (`LEAD`), the shared tool-set prompts (`TOOLSETS`), InfoMem's scoring
    prompts (`parser.train.infomem.gain.SCORING`) and each baseline's own prompts
    (`parser/methods/<name>/prompts/`, declared in that method's folder) are separate sets, so a
    change to one never changes another's version.

        PROMPTS = PromptSet(__package__, {"rag_user": {"question"}}, "prompts")   # in parser/methods/rag/
    """

    def __init__(self, package: str, fields: dict[str, set[str]], folder: str = "",
                 default_version: str = DEFAULT_VERSION):
        self.package, self.folder, self.fields, self.default_version = package, folder, fields, default_version
        # prompts are read once per (name, version); the caches belong to this set
        self.load = functools.lru_cache(maxsize=None)(self._load)
        self.tools = functools.lru_cache(maxsize=None)(self._tools)

    def path(self, version: str, filename: str) -> Any:
        root = resources.files(self.package)
        return (root / self.folder if self.folder else root) / version / filename

    def _where(self) -> str:
        return f"{self.package.replace('.', '/')}/{self.folder}".rstrip("/")

    def _load(self, name: str, version: str | None = None) -> str:
        version = version or self.default_version
        if name not in self.fields:
            raise KeyError(f"unknown prompt {name!r} in {self._where()}; known: {sorted(self.fields)}")
        path = self.path(version, f"{name}.txt")
        if not path.is_file():
            raise FileNotFoundError(f"prompt {name!r} missing for version {version!r}: {path}")
        return path.read_text(encoding="utf-8").removesuffix("\n")

    def render(self, name: str, version: str | None = None, **fields: Any) -> str:
        missing = self.fields.get(name, set()) - fields.keys()
        if missing:
            raise KeyError(f"prompt {name!r} ({version or self.default_version}) needs field(s) {sorted(missing)}")
        template = self.load(name, version)
        return template.format(**fields) if self.fields[name] else template

    def _tools(self, version: str | None = None) -> Any:
        """The set's `tools.json`: OpenAI-style function schemas for `apply_chat_template(tools=...)`."""
        return json.loads(self.path(version or self.default_version, "tools.json").read_text(encoding="utf-8"))

    def schemas(self, *names: str, version: str | None = None) -> list[dict[str, Any]]:
        """The named tools' function schemas from the set's `tools.json`, in the order asked."""
        version = version or self.default_version
        known = self.tools(version)
        unknown = [n for n in names if n not in known]
        if unknown:
            raise KeyError(f"no tool schema for {unknown} in {self._where()}/{version}/tools.json; known: {sorted(known)}")
        return [known[n] for n in names]


LEAD = PromptSet(__package__, FIELDS)

# Tool-set prompts that more than one method uses (`prompts/toolsets/<version>/`): the DCI
# sandbox's `read`/`bash` schemas (`parser.engine.sandbox.tools.SandboxTools`: the DCI agent and ParSer's DCI
# reader), the DCI subagent's prompts (`parser.engine.readers.dci`, a ParSer component), and the hint a
# function-calling tool set gives after an invalid action (agentic RAG, both DCI uses). A prompt
# only one method uses lives in that method's folder (`parser/methods/<name>/prompts/`). The
# engine's own turns (continuation, finalize, compaction placeholder) are in `LEAD`.
TOOLSET_FIELDS = {
    "dci_subagent_system": set(),
    "dci_subagent_user": {"query"},
    "invalid_action": {"error"},
}

TOOLSETS = PromptSet(__package__, TOOLSET_FIELDS, "toolsets")


def render(name: str, version: str = DEFAULT_VERSION, **fields: Any) -> str:
    return LEAD.render(name, version, **fields)


def lead_tools(version: str = DEFAULT_VERSION) -> list[dict[str, Any]]:
    """The lead's one tool, `query_agents`, as an OpenAI-style function schema."""
    return LEAD.tools(version)
