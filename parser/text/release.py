"""The authors' release (github.com/cuhk-parser/PARSER, MIT): its protocol facts, and its prose read from a checkout.

Why: the released checkpoint (`inNexus/parser-qwen35-4b`) was trained on what the release shows
the models — its prompts, observation JSON, turn rules, subagent abstention, chunk headers and
reward. `parser.engine.protocol.ReleaseProtocol` (chosen by `EpisodeConfig.protocol: release`) makes the
engine do exactly that, so the checkpoint runs in-distribution; docs/fidelity.md lists every
difference from this project's own protocol.

Facts of the protocol (tags, JSON keys, fixed messages, the user-turn header, stop strings)
live here as constants. The release's long prose (the lead system prompt, the subagent prompt,
the tool description and the invalid-step hint) is the authors' text: the project carries no
copy. It is read at run time from a checkout of the release, by parsing its Python files
without executing them:

    git clone https://github.com/cuhk-parser/PARSER /path/to/PARSER
    parser eval method=parser_release method.episode.protocol_release.repo=/path/to/PARSER

(or `export PARSER_RELEASE_REPO=/path/to/PARSER`, which the configs read).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Any

from parser.text.chat_format import CHATML

RELEASE_URL = "https://github.com/cuhk-parser/PARSER"
REPO_ENV = "PARSER_RELEASE_REPO"

# --- protocol facts (release/train/scripts/{prompt,subagent,parser_agent_loop}.py) ---
USER_TURN = "## Question\n\n{question}\n"
NO_FINDINGS = "No agents found relevant information for this query."
NO_ANSWER = "No answer found"  # what the release's answer extraction returns when there is none
STOP_STRINGS = ("unknown", "Unknown", " unknown", " Unknown")  # the subagent's SGLang stop strings
TRAILING_MARKERS = CHATML.stop_tokens  # stripped from the end of each decoded lead turn
AGENT_KEY = "agent_{index}"
FINDING_KEYS = ("evidence", "answer")
RAW_KEY = "raw_response"
RAW_MIN_CHARS = 64  # a non-JSON reply longer than this is passed on as `raw_response`
INVALID_MASK_REWARD = 0.2  # invalid turns train (mask 1) only in episodes rewarded below this


def unknown_tool_error(name: str) -> str:
    return json.dumps({"error": f"unknown tool {name!r}, expected query_agents"}, ensure_ascii=False)


def query_type_error(value: Any) -> str:
    return json.dumps({"error": f"invalid query type {type(value)!r}, expected str"}, ensure_ascii=False)


MISSING_QUERY_ERROR = json.dumps({"error": "missing required argument 'query'"}, ensure_ascii=False)


def strip_trailing_markers(text: str) -> str:
    """The release's clean-up of one decoded lead turn: trailing end-of-turn markers and spaces."""
    text = text.rstrip()
    while text.endswith(TRAILING_MARKERS):
        marker = next(m for m in TRAILING_MARKERS if text.endswith(m))
        text = text[: -len(marker)].rstrip()
    return text


def extract_answer(text: str) -> str | None:
    """The release's answer: the last `<answer>…</answer>` (stripped); None if absent or empty.
    The release returns the string "No answer found" for a missing answer and tests for it, so an
    answer that *says* "No answer found" is no answer there either (an invalid step)."""
    close = text.rfind("</answer>")
    if close < 0:
        return None
    open_ = text.rfind("<answer>", 0, close)
    if open_ < 0:
        return None
    answer = text[open_ + len("<answer>"): close].strip()
    return answer if answer and answer != NO_ANSWER else None


# --- the authors' prose, read from a checkout ---
PROMPT_FILE = "train/scripts/prompt.py"
LOOP_FILE = "train/scripts/parser_agent_loop.py"


@dataclasses.dataclass(frozen=True)
class ReleasePrompts:
    lead_system: str
    subagent: str  # str.format template with {chunk_content} and {question}
    tools: list[dict[str, Any]]  # the lead's tool schema, as the release passes it to the template
    invalid_hint: str

    def subagent_prompt(self, chunk: str, query: str) -> str:
        return self.subagent.format(chunk_content=chunk, question=query)


def resolve_repo(repo: str | os.PathLike | None) -> Path:
    repo = repo or os.environ.get(REPO_ENV)
    if not repo:
        raise FileNotFoundError(
            f"protocol=release needs a checkout of the authors' release for its prompts: "
            f"git clone {RELEASE_URL} and set protocol_release.repo (or {REPO_ENV}) to it"
        )
    return Path(repo).expanduser()


def _module(path: Path) -> ast.Module:
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: protocol=release reads its prompts from a checkout of the authors' "
            f"release — git clone {RELEASE_URL} and set protocol_release.repo (or {REPO_ENV}) to it"
        )
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _constant(tree: ast.AST, name: str, path: Path) -> Any:
    """The literal assigned to `name` anywhere in the file (module level or inside a function)."""
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                continue
    raise ValueError(f"{path}: no literal assignment to {name}; is this a checkout of {RELEASE_URL}?")


def load_release_prompts(repo: str | os.PathLike | None = None) -> ReleasePrompts:
    """Parse (never import) the release's prompt and agent-loop files under `repo` (None: $PARSER_RELEASE_REPO)."""
    return _load(str(resolve_repo(repo).resolve()))


@functools.lru_cache(maxsize=8)
def _load(repo: str) -> ReleasePrompts:
    root = Path(repo)
    prompt_path, loop_path = root / PROMPT_FILE, root / LOOP_FILE
    prompt_tree, loop_tree = _module(prompt_path), _module(loop_path)
    user = _constant(prompt_tree, "LEAD_AGENT_USER_PROMPT", prompt_path)
    if user != USER_TURN:
        raise ValueError(f"{prompt_path}: LEAD_AGENT_USER_PROMPT is {user!r}, this project implements {USER_TURN!r}")
    return ReleasePrompts(
        lead_system=_constant(prompt_tree, "LEAD_AGENT_SYSTEM_PROMPT", prompt_path),
        subagent=_constant(prompt_tree, "SUBAGENT_USER_PROMPT", prompt_path),
        tools=_constant(loop_tree, "SUBAGENT_QUERY_TOOLS", loop_path),
        invalid_hint=_constant(loop_tree, "illegal_hint", loop_path),
    )
