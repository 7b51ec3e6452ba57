"""A stand-in for a checkout of the authors' release (github.com/cuhk-parser/PARSER), for tests and
offline smoke runs: the same two files, the same constant names and shapes, placeholder prose.

Why: `protocol: release` reads the release's prompts from a real clone at run time
(`parser.text.release.load_release_prompts`); CI has no network and the project carries no copy of
that prose. Everything the project derives from the files — the template fields, the JSON
escapes, the tool schema's shape, the hint being a local of the agent loop — is exercised.

    python -c "from support.release_standin import write_release_standin; print(write_release_standin('/tmp/release'))"
"""
from __future__ import annotations

from pathlib import Path

# placeholder prose; the layout and literal forms are the release's
PROMPT_PY = '''"""Stand-in prompt templates (placeholder prose)."""

LEAD_AGENT_SYSTEM_PROMPT = """STAND-IN lead system prompt. Call `query_agents`; answer in <answer>...</answer>.
"""

LEAD_AGENT_USER_PROMPT = """## Question

{question}
"""

SUBAGENT_USER_PROMPT = """STAND-IN subagent prompt. Reply ```json
{{"evidence": "...", "answer": "..."}}
``` or Unknown.

**Document Chunk:**
{chunk_content}

**Question:**
{question}
"""
'''

LOOP_PY = '''"""Stand-in lead-agent loop (placeholder prose, same literal forms)."""
from typing import Any

SUBAGENT_QUERY_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "query_agents",
            "description": (
                "STAND-IN tool description: "
                "broadcast a query to every chunk agent."
            ),
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "STAND-IN query description."}},
                "required": ["query"],
            },
        },
    }
]


class StandInLoop:
    async def run(self):
        illegal_hint = (
            "STAND-IN invalid step: call `query_agents` "
            "or answer in <answer>your answer</answer>."
        )
        return illegal_hint
'''


def write_release_standin(root: str | Path) -> Path:
    """Write the stand-in checkout under `root`; returns `root` (give it as protocol_release.repo)."""
    root = Path(root)
    scripts = root / "train" / "scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    (scripts / "prompt.py").write_text(PROMPT_PY, encoding="utf-8")
    (scripts / "parser_agent_loop.py").write_text(LOOP_PY, encoding="utf-8")
    return root
