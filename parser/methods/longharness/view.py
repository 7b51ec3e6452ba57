"""LongHarness's part of the trajectory viewer (`eval.viewer`): the state after each round.

Why it exists: the shared viewer shows what every episode has (rounds, queries, findings, the
answer); LongHarness also keeps explicit state, the conclusions with their trace and the evidence
ledger, and what each round's update did or was refused. The viewer calls this renderer by the
name the method class declares (`LongHarnessMethod.view`) and never names the method itself.
It uses the viewer's CSS classes (`index`, `tag`, `evidence`, `query`, `warn`, `meta`) and
escapes every model-written string: model text is data, never markup.

    html = render(result.trace.extras)   # the LongHarness part of one sample's trajectory
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from parser.text.markup import escape


def render_state(round_: Mapping[str, Any]) -> str:
    """The state after one round (conclusions, then the evidence ledger), what the round's update
    did and refused, and which items the state budget left out of the lead's view."""
    state, applied = round_.get("state") or {}, round_.get("applied") or {}
    hidden = set(round_.get("hidden") or [])
    rows = ["<div class='state'><b>Conclusions</b><table class='index'>"]
    for c in state.get("conclusions", []):
        trace = "; ".join(str(h.get("note") or h.get("status")) + (f" (was: {h['was']})" if h.get("was") else "")
                          for h in c.get("history", []))
        rows.append(f"<tr><td>{escape(c.get('id'))}{' <span class=tag>not shown</span>' if c.get('id') in hidden else ''}</td>"
                    f"<td><span class='tag'>{escape(c.get('status'))}</span></td><td>{escape(c.get('statement'))}</td>"
                    f"<td>{escape(', '.join(c.get('evidence', [])))}</td><td class='evidence'>{escape(trace)}</td></tr>")
    rows.append("</table><b>Evidence ledger</b><table class='index'>")
    for e in state.get("evidence", []):
        status = e.get("status", "")
        status += f" by {e['superseded_by']}" if e.get("superseded_by") else ""
        status += f": {e['reason']}" if e.get("reason") else ""
        rows.append(f"<tr><td>{escape(e.get('id'))}{' <span class=tag>not shown</span>' if e.get('id') in hidden else ''}</td>"
                    f"<td><span class='tag'>{escape(status)}</span></td><td>{escape(e.get('source'))}</td>"
                    f"<td class='evidence'>&ldquo;{escape(e.get('quote'))}&rdquo;</td><td>{escape(e.get('query'))} → {escape(e.get('conclusion'))}</td></tr>")
    rows.append("</table>")
    for query in applied.get("queries", []):
        rows.append(f"<div class='query'>query for {escape(query.get('conclusion'))}: <b>{escape(query.get('query'))}</b> "
                    f"<span class='tag'>{escape(', '.join(query.get('outcomes', [])) or 'nothing came back')}</span></div>")
    for refusal in applied.get("refused", []) + list(round_.get("problems") or []):
        rows.append(f"<div class='warn'>refused: {escape(refusal)}</div>")
    rows.append(f"<div class='meta'>lead prompt {escape(round_.get('prompt_tokens'))} tokens · counters "
                f"{escape(json.dumps(state.get('counters', {})))}</div></div>")
    return "\n".join(rows)


def render(trace: Mapping[str, Any]) -> str:
    """The state after each round of one LongHarness sample, in round order ("" if it kept none)."""
    rounds = (trace.get("longharness") or {}).get("rounds") or []
    return "\n".join(f"<div class='turn'><b>State after round {i + 1}</b>\n{render_state(round_)}</div>"
                     for i, round_ in enumerate(rounds))
