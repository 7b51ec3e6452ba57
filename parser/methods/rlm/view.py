"""RLM's part of the trajectory viewer (`eval.viewer`): each iteration's code, output and sub-calls.

Why it exists: the shared viewer shows the root's turns; what an RLM iteration did is in its REPL
cells — the code of each ```repl block, its stdout and stderr, the variables it left, the
`llm_query` prompts it sent and the replies. The
viewer calls this renderer by the name the method class declares (`RLMMethod.view`). Every
model-written string is escaped: model text (and the document it printed) is data, never markup.

    html = render(result.trace.extras)   # the RLM part of one sample's trajectory
"""
from __future__ import annotations

from typing import Any, Mapping

from parser.text.markup import escape

MAX_SHOWN = 4000  # characters of one stdout / stderr / prompt / reply on the page (the record keeps all)


def _clip(text: str | None) -> str:
    text = text or ""
    return escape(text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + f"… [{len(text) - MAX_SHOWN} more characters]")


def render_block(n: int, block: Mapping[str, Any]) -> str:
    """One cell: its code, stdout, stderr, variables and sub-calls."""
    tags = [f"{escape(block.get('seconds'))} s"]
    if block.get("final_answer") is not None:
        tags.append(f"answer set: {escape(block['final_answer'])}")
    if block.get("lost_state"):
        tags.append("worker killed: variables lost")
    rows = [f"<div class='query'>block {n} " + "".join(f"<span class='tag'>{t}</span>" for t in tags) + "</div>",
            f"<pre>{escape(block.get('code'))}</pre>"]
    if block.get("stdout"):
        rows.append(f"<div class='meta'>stdout</div><pre>{_clip(block['stdout'])}</pre>")
    if block.get("stderr"):
        rows.append(f"<div class='warn'>stderr</div><pre>{_clip(block['stderr'])}</pre>")
    if block.get("variables"):
        rows.append(f"<div class='meta'>variables: {escape(', '.join(block['variables']))}</div>")
    for call in block.get("sub_calls") or []:
        model = f" (model {escape(call['model'])})" if call.get("model") else ""
        rows.append(f"<div class='meta'>sub-call{model}: {len(call.get('prompts') or [])} prompt(s)</div>")
        for prompt, reply in zip(call.get("prompts") or [], call.get("replies") or [], strict=True):
            rows.append(f"<div class='finding'><b>prompt</b><pre>{_clip(prompt)}</pre><b>reply</b>"
                        f"<div class='evidence'>{_clip(reply)}</div></div>")
    return "\n".join(rows)


def render(trace: Mapping[str, Any]) -> str:
    """Each iteration of one RLM sample, in order ("" if it kept none)."""
    part = trace.get("rlm") or {}
    out = []
    for it in part.get("iterations") or []:
        title = "Fallback answer call" if it.get("fallback") else f"Iteration {int(it.get('iteration', 0)) + 1}"
        rows = [f"<div class='turn'><b>{title}</b> <span class='tag'>{escape(it.get('prompt_tokens'))} prompt tokens</span>",
                f"<pre>{_clip(it.get('response'))}</pre>"]
        rows += [render_block(n, block) for n, block in enumerate(it.get("blocks") or [], start=1)]
        out.append("\n".join(rows) + "</div>")
    if part:
        usage = part.get("usage") or {}
        out.append(f"<div class='meta'>rlms {escape(part.get('rlms_version'))} · stopped: {escape(part.get('stop_reason'))} · "
                   + " · ".join(f"{escape(role)}: {escape(u.get('calls'))} calls, {escape(u.get('input_tokens'))} in / "
                                f"{escape(u.get('output_tokens'))} out tokens" for role, u in usage.items())
                   + "</div>")
    return "\n".join(out)
