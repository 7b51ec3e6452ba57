"""rlms 0.1.3 (`pip install 'parser-agents[peers]'`), rule by rule: its prompts, read from the
installed package, and the text of its turn protocol, restated here so the method reproduces its
messages byte for byte.

Why: `method=rlm` is the Recursive Language Model as its authors' package runs it. Its long
prose (`RLM_SYSTEM_PROMPT`, `ORCHESTRATOR_ADDENDUM`, `USER_PROMPT`) is the authors' text and the
project carries no copy: `load_prompts("rlms")` parses `rlm/utils/prompts.py` of the installed
package without importing it (importing `rlm` loads its model clients and calls `load_dotenv()`,
which reads any `.env` in the working directory). Short protocol facts (the first-turn safeguard,
the metadata message, the REPL output frame, the fallback request, the 20,000-character cut) are
constants below; `load_prompts` refuses a package whose source no longer contains each of them,
so a changed rlms fails loudly instead of drifting. A JSON file with the three constants (what
`scripts/record_rlm_fixtures.py` writes to tests/fixtures/rlm/prompts.json) stands in where rlms
is absent, as the release protocol's stand-in checkout does (parser/text/release.py).

    prompts = load_prompts("rlms")                        # the installed package
    prompts = load_prompts("tests/fixtures/rlm/prompts.json")
    history = prompts.opening(context, question)          # [system, user(metadata)]
    history.append(prompts.turn(0, max_iterations=30))    # "You have not interacted ... Turn 1/30:"
    blocks = find_code_blocks(reply)
    history += format_iteration(reply, [CellOutput(...), ...])
"""
from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import importlib.util
import json
import re
import textwrap
from pathlib import Path
from typing import Any, Sequence

PACKAGE, PIN = "rlms", "0.1.3"
INSTALL_HINT = "pip install 'parser-agents[peers]' (rlms==0.1.3)"
PROMPT_NAMES = ("RLM_SYSTEM_PROMPT", "ORCHESTRATOR_ADDENDUM", "USER_PROMPT")

# -- protocol facts (rlm/utils/prompts.py build_rlm_system_prompt / build_user_prompt) -------------
SAFEGUARD = ("You have not interacted with the REPL environment or seen your prompt / context "
             "yet. Look at the context first; do not provide a final answer yet.\n\n")
METADATA = ("Your context is a {context_type} of {total} total characters. "
            "Each sub-LLM call can handle roughly ~100k tokens at once.")
ROOT_PROMPT = "Answer the following: {root_prompt}\n\n{metadata}"
# -- rlm/core/rlm.py RLM._default_answer: sent as an *assistant* message --------------------------
FALLBACK = "Please provide a final answer to the user's question based on the information provided."
# -- rlm/utils/parsing.py find_code_blocks / format_iteration / format_execution_result ------------
CODE_BLOCK = re.compile(r"```repl\s*\n(.*?)\n```", re.DOTALL)
MAX_OUTPUT_CHARS = 20_000  # each block's formatted output, cut with the marker below
CUT = "... + [{rest} chars...]"
HEADER, MULTI_HEADER = "REPL output:", "REPL output (block {n}):"
NO_OUTPUT, VARIABLES = "No output", "REPL variables: {names}\n"
# fragments each fact must still have in the package's source (prompts.py, parsing.py, rlm.py)
_FACTS = {
    "utils/prompts.py": ("You have not interacted with the REPL environment or seen your prompt / context ",
                         "yet. Look at the context first; do not provide a final answer yet.\\n\\n",
                         "Each sub-LLM call can handle roughly ~100k tokens at once.", "total characters. ",
                         'f"Answer the following: {root_prompt}\\n\\n{metadata_body}"'),
    "utils/parsing.py": (r'r"```repl\s*\n(.*?)\n```"', "max_character_length: int = 20000",
                         '+ f"... + [{len(result) - max_character_length} chars...]"',
                         'f"REPL output (block {i + 1}):" if multi else "REPL output:"',
                         'f"REPL variables: {list(important_vars.keys())}\\n"', '"No output"'),
    "core/rlm.py": ('"role": "assistant",\n                "content": "Please provide a final answer to the '
                    "user's question based on the information provided.\"",),
}


@dataclasses.dataclass(frozen=True)
class Prompts:
    """rlms' three prompt constants and where they came from (`version`: the package's, recorded in each row)."""

    system: str  # RLM_SYSTEM_PROMPT, a str.format template with {custom_tools_section}
    addendum: str  # ORCHESTRATOR_ADDENDUM
    user: str  # USER_PROMPT, "Turn {iter_1}/{max_iter}:"
    version: str
    source: str

    def opening(self, context: str | list | dict, root_prompt: str | None, orchestrator: bool = True) -> list[dict[str, str]]:
        """`build_rlm_system_prompt` without custom tools: the system prompt (+ the addendum) and the metadata message."""
        system = self.system.format(custom_tools_section="")
        if orchestrator:
            system = f"{system}\n\n{self.addendum}"
        metadata = METADATA.format(context_type=context_type(context), total=sum(context_lengths(context)))
        user = ROOT_PROMPT.format(root_prompt=root_prompt, metadata=metadata) if root_prompt else metadata
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def turn(self, iteration: int, max_iterations: int) -> dict[str, str]:
        """`build_user_prompt` for one context and no history: "Turn i/N:", the safeguard before the first."""
        body = self.user.format(iter_1=iteration + 1, max_iter=max_iterations)
        return {"role": "user", "content": SAFEGUARD + body if iteration == 0 else body}


def context_type(context: Any) -> str:
    """`QueryMetadata.context_type`."""
    for kind in (str, dict, list):
        if isinstance(context, kind):
            return kind.__name__
    raise ValueError(f"rlm: the context must be a str, list or dict, got {type(context).__name__}")


def context_lengths(context: Any) -> list[int]:
    """`QueryMetadata.context_lengths`: characters per part (JSON for a non-string part)."""
    def size(chunk: Any) -> int:
        try:
            return len(json.dumps(chunk, default=str))
        except Exception:  # as theirs: whatever json.dumps cannot take is measured by its repr
            return len(repr(chunk))

    if isinstance(context, str):
        return [len(context)]
    if isinstance(context, dict):
        return [len(v) if isinstance(v, str) else size(v) for v in context.values()]
    if isinstance(context, list):
        if not context:
            return [0]
        if isinstance(context[0], dict):
            if "content" in context[0]:
                return [len(str(chunk.get("content", ""))) for chunk in context]
            return [size(chunk) for chunk in context]
        return [len(chunk) for chunk in context]
    raise ValueError(f"rlm: the context must be a str, list or dict, got {type(context).__name__}")


def find_code_blocks(text: str) -> list[str]:
    """`find_code_blocks`: every ```repl block, in order, stripped."""
    return [match.group(1).strip() for match in CODE_BLOCK.finditer(text)]


@dataclasses.dataclass(frozen=True)
class CellOutput:
    """What `format_execution_result` reads of one block's result. The sandbox keeps at most
    `ReplLimits.output_chars` (>= `MAX_OUTPUT_CHARS`) of each stream and says the whole length, so
    the cut below is rlms' exactly: the kept head is the head, and the count covers the whole text."""

    stdout: str
    stderr: str
    variables: Sequence[str]  # the names it lists, in its order (the sandbox applies its filter)
    stdout_chars: int | None = None  # the whole length when `stdout` is a kept head (None: whole)
    stderr_chars: int | None = None

    @property
    def missing(self) -> int:
        """Characters the sandbox did not keep."""
        return sum(whole - len(kept) for whole, kept in ((self.stdout_chars, self.stdout), (self.stderr_chars, self.stderr))
                   if whole is not None)


def format_execution_result(result: CellOutput) -> str:
    parts = []
    if result.stdout:
        parts.append(f"\n{result.stdout}")
    if result.stderr:
        parts.append(f"\n{result.stderr}")
    if result.variables:
        parts.append(VARIABLES.format(names=list(result.variables)))
    return "\n\n".join(parts) if parts else NO_OUTPUT


def format_iteration(response: str, results: Sequence[CellOutput], max_chars: int = MAX_OUTPUT_CHARS) -> list[dict[str, str]]:
    """`format_iteration`: the reply as an assistant message, then every block's output (each cut
    at `max_chars`, the count of what was cut covering what the sandbox did not keep) in one user
    message; no user message when no block ran."""
    messages = [{"role": "assistant", "content": response}]
    parts = []
    for n, result in enumerate(results, start=1):
        text = format_execution_result(result)
        whole = len(text) + result.missing
        if whole > max_chars:
            text = text[:max_chars] + CUT.format(rest=whole - max_chars)
        parts.append(f"{MULTI_HEADER.format(n=n) if len(results) > 1 else HEADER}\n{text}")
    if parts:
        messages.append({"role": "user", "content": "\n\n".join(parts)})
    return messages


def fallback_messages(history: list[dict[str, str]]) -> list[dict[str, str]]:
    """`_default_answer`'s request: the history and the fallback request as an assistant message."""
    return history + [{"role": "assistant", "content": FALLBACK}]


# -- reading the prompts ------------------------------------------------------------------------
def load_prompts(source: str = PACKAGE) -> Prompts:
    """The prompts from the installed rlms (`source: rlms`) or from a JSON file of the three constants."""
    if source == PACKAGE:
        return _from_package()
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"rlm: prompt_source {source!r} is neither 'rlms' nor a JSON file")
    data = json.loads(path.read_text(encoding="utf-8"))
    missing = [k for k in (*PROMPT_NAMES, "rlms_version") if not isinstance(data.get(k), str)]
    if missing:
        raise ValueError(f"{path}: missing string field(s) {missing}")
    return Prompts(data["RLM_SYSTEM_PROMPT"], data["ORCHESTRATOR_ADDENDUM"], data["USER_PROMPT"],
                   data["rlms_version"], str(path))


def _from_package() -> Prompts:
    spec = importlib.util.find_spec("rlm")  # finds the package without executing it
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"rlm: method=rlm reads its prompts from the rlms package; install it: {INSTALL_HINT}")
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, fragments in _FACTS.items():
        text = (root / name).read_text(encoding="utf-8")
        changed = [f for f in fragments if f not in text]
        if changed:
            raise ValueError(f"{root / name}: the rlms protocol changed ({changed[0]!r} is gone); this method "
                             f"implements rlms {PIN}: {INSTALL_HINT}")
    path = root / "utils" / "prompts.py"
    values = _constants(ast.parse(path.read_text(encoding="utf-8"), str(path)), path)
    return Prompts(values["RLM_SYSTEM_PROMPT"], values["ORCHESTRATOR_ADDENDUM"], values["USER_PROMPT"],
                   importlib.metadata.version(PACKAGE), str(path))


def _constants(tree: ast.Module, path: Path) -> dict[str, str]:
    """The three module-level constants, evaluated from their literal forms only: a string,
    `textwrap.dedent(<string>)` or `"<sep>".join([<strings>])` (the forms rlms 0.1.3 uses)."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in PROMPT_NAMES:
            found[node.targets[0].id] = _literal(node.value, path, node.targets[0].id)
    missing = [n for n in PROMPT_NAMES if n not in found]
    if missing:
        raise ValueError(f"{path}: no literal assignment to {missing}; this method implements rlms {PIN}")
    return found


def _literal(node: ast.expr, path: Path, name: str) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords and isinstance(node.func, ast.Attribute):
        func, arg = node.func, node.args[0]
        if func.attr == "dedent" and isinstance(func.value, ast.Name) and func.value.id == "textwrap":
            return textwrap.dedent(_literal(arg, path, name))
        if func.attr == "join" and isinstance(func.value, ast.Constant) and isinstance(arg, (ast.List, ast.Tuple)):
            return func.value.value.join(_literal(item, path, name) for item in arg.elts)
    raise ValueError(f"{path}:{node.lineno}: {name} is not a literal form this reader evaluates "
                     f"(a string, textwrap.dedent or str.join of strings); this method implements rlms {PIN}")
