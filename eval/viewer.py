"""The trajectory viewer: one static HTML page per eval run, the paper's case-study figures generated.

For every sample: the question, the final answer against the gold answers (Sub_EM mark), and,
for ParSer trajectories, each lead round: its thinking, the queries it scattered, which agents
answered with what evidence (abstentions are counted, not shown), failed subagent calls, and
invalid actions; then what the method's own view shows (a method class's `view`, a
"module:function" path, such as the explicit state a method keeps per round). Other methods'
records are shown as their JSON trace. The page is plain HTML
and CSS (no scripts, no network), so it opens from disk and can be attached to a report.

Everything a model wrote is escaped: model text is data, never markup.

    parser view outputs/eval/hqa_parser4b              # -> outputs/eval/hqa_parser4b/viewer.html
    parser view RUN_DIR --out page.html --only-wrong --max-samples 50
"""
from __future__ import annotations

import argparse
import functools
import importlib
import json
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from eval.store import read_results
from parser.methods import method_class, method_config
from parser.records.metrics import PRIMARY
from parser.records.result import ResultRow
from parser.records.trace import SequentialTrace
from parser.records.trajectory import Trajectory
from parser.text.markup import escape

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:1em 2em;color:#1d1d1f;background:#fafafa}
h1{font-size:1.4em} .meta{color:#666;font-size:.9em}
table.index{border-collapse:collapse;width:100%;margin:1em 0} .index td,.index th{border-bottom:1px solid #ddd;padding:3px 6px;text-align:left;font-size:.9em}
details.sample{background:#fff;border:1px solid #ddd;border-radius:6px;margin:.8em 0;padding:.4em .8em}
details.sample>summary{cursor:pointer;font-weight:600}
.ok{color:#0a7c2f} .bad{color:#b3261e} .tag{display:inline-block;border-radius:4px;padding:0 5px;font-size:.8em;background:#eee;margin-left:4px}
.turn{border-left:3px solid #4a7bd0;margin:.7em 0;padding:.2em .8em;background:#f4f7fc}
.think{white-space:pre-wrap;color:#555;font-style:italic;max-height:18em;overflow:auto;background:#fff;padding:.4em;border:1px dashed #ccc}
.query{margin:.5em 0 .5em 1em} .query b{color:#4a2bd0}
.finding{margin:.2em 0 .2em 2em;padding:.2em .5em;background:#fff;border:1px solid #e3e3e3;border-radius:4px}
.evidence{color:#555;font-size:.9em;white-space:pre-wrap}
.failed{color:#b3261e;margin-left:2em;font-size:.9em} .warn{color:#9a6700}
.answer{font-weight:600;margin:.5em 0} pre{white-space:pre-wrap;background:#fff;border:1px solid #ddd;padding:.5em;max-height:30em;overflow:auto}
"""


def _mark(score: float | None) -> str:
    if score is None:
        return ""
    return '<span class="ok">✓</span>' if score >= 1 else '<span class="bad">✗</span>'


def render_trajectory(trajectory: Trajectory) -> str:
    parts = []
    for turn in trajectory.turns:
        parts.append(f'<div class="turn"><div><b>Round {escape(turn.index + 1)}</b>'
                     f'<span class="tag">{escape(turn.lead_tokens)} lead tokens</span>'
                     f'<span class="tag">{escape(round(float(turn.lead_latency_s), 2))} s lead</span>'
                     f'<span class="tag">{escape(round(float(turn.scatter_latency_s), 2))} s scatter</span>'
                     + ('<span class="tag warn">cut at token limit</span>' if turn.finish_reason == "length" else "")
                     + "</div>")
        if turn.thinking:
            parts.append(f'<div class="think">{escape(turn.thinking)}</div>')
        if turn.action_error:
            parts.append(f'<div class="warn">invalid action: {escape(turn.action_error)}</div>'
                         f'<pre>{escape(turn.text)}</pre>')
        for q in turn.queries:
            abstained = sum(c.status == "abstain" for c in q.calls)
            failed = [c for c in q.calls if c.status == "failed"]
            parts.append(f'<div class="query">query_agents: <b>{escape(q.query)}</b>'
                         f'<span class="tag">{len(q.findings)} finding(s)</span><span class="tag">{abstained} abstained</span>'
                         + (f'<span class="tag bad">{len(failed)} failed</span>' if failed else "")
                         + (f'<span class="tag warn">{escape(q.omitted)} cut by budget</span>' if q.omitted else "")
                         + "</div>")
            for f in q.findings:
                agents = [f.agent, *f.merged_agents]
                parts.append(f'<div class="finding"><b>{escape(", ".join(a for a in agents if a))}</b>: {escape(f.answer)}'
                             + (f'<div class="evidence">evidence: {escape(f.evidence)}</div>' if f.evidence else "")
                             + "</div>")
            for c in failed:
                parts.append(f'<div class="failed">chunk {escape(c.chunk_index)} failed after {escape(c.attempts)} '
                             f'attempt(s): {escape(c.error)}</div>')
        if turn.answer is not None:
            parts.append(f'<div class="answer">answer: {escape(turn.answer)}</div>')
        parts.append("</div>")
    if trajectory.stop_reason and trajectory.stop_reason != "answer":
        parts.append(f'<div class="warn">stopped: {escape(trajectory.stop_reason)}</div>')
    return "\n".join(parts)


@functools.lru_cache(maxsize=None)
def method_view(name: str) -> Callable[[dict[str, Any]], str] | None:
    """The renderer a method declares for what this page does not show (`view = "module:function"`
    on the class its configs/method/<name>.yaml names; it is given the trajectory's `extras`, the
    method's own part), or None: the page names no method."""
    try:
        target = method_config(name)["_target_"]
    except FileNotFoundError:  # a row whose method has no config here (an old or a renamed one)
        return None
    path = getattr(method_class(target), "view", None)
    if path is None:
        return None
    module, _, function = path.partition(":")
    return getattr(importlib.import_module(module), function)


def render_sample(row: ResultRow, anchor: str, open_: bool = False) -> str:
    score, trace = row.scores.get(PRIMARY), row.trace
    num_chunks = trace.num_chunks if isinstance(trace, (Trajectory, SequentialTrace)) else None
    summary = (f'{_mark(score)} <code>{escape(row.sample_id)}</code> · L={escape(row.length)} · run {escape(row.run)}'
               + (f' · {escape(row.condition)}' if row.condition else "")
               + f' — {escape(row.question)}')
    body = [f'<p><b>Question:</b> {escape(row.question)}</p>',
            f'<p><b>Prediction:</b> {escape(row.prediction) or "<i>(no answer)</i>"} {_mark(score)} &nbsp; <b>Gold:</b> '
            f'{escape(" | ".join(row.answers))}</p>',
            f'<p class="meta">Sub_EM {escape(score)} · EM {escape(row.scores.get("em"))} · {escape(row.steps)} steps · '
            f'{escape(row.wall_s)} s · lead {escape(row.lead_output_tokens)} / subagents '
            f'{escape(row.subagent_output_tokens)} output tokens'
            + (f' · {escape(num_chunks)} chunks' if num_chunks is not None else "") + "</p>"]
    if isinstance(trace, Trajectory):
        body.append(render_trajectory(trace))
        view = method_view(row.method)
        if view is not None:
            body.append(view(trace.extras))
    elif trace is not None:
        body.append(f"<pre>{escape(json.dumps(trace.to_dict(), indent=1, ensure_ascii=False, default=str))}</pre>")
    return f'<details class="sample" id="{anchor}"{" open" if open_ else ""}><summary>{summary}</summary>\n' + "\n".join(body) + "\n</details>"


def render_page(rows: Sequence[ResultRow], title: str) -> str:
    rows = sorted(rows, key=lambda r: (r.dataset, r.length, r.condition or "", r.run, r.sample_id))
    correct = sum(r.scores.get(PRIMARY) or 0 for r in rows)
    index = ["<table class='index'><tr><th></th><th>sample</th><th>L</th><th>run</th><th>prediction</th><th>gold</th><th>steps</th></tr>"]
    samples = []
    for i, r in enumerate(rows):
        anchor = f"s{i}"
        index.append(f'<tr><td>{_mark(r.scores.get(PRIMARY))}</td><td><a href="#{anchor}">{escape(r.sample_id)}</a></td>'
                     f'<td>{escape(r.length)}</td><td>{escape(r.run)}</td><td>{escape(r.prediction or "—")}</td>'
                     f'<td>{escape(" | ".join(r.answers))}</td><td>{escape(r.steps)}</td></tr>')
        samples.append(render_sample(r, anchor, open_=i == 0))  # the first one open: the page shows a trajectory
    index.append("</table>")
    head = rows[0] if rows else None
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{escape(title)}</h1><p class='meta'>method {escape(head and head.method)} · {escape(head and head.row)} · "
            f"{escape(head and head.backbone)} · {len(rows)} samples · Sub_EM {100 * correct / max(len(rows), 1):.1f}%</p>"
            + "\n".join(index) + "\n" + "\n".join(samples) + "</body></html>")


def select(rows: Iterable[ResultRow], only_wrong: bool = False, max_samples: int | None = None) -> list[ResultRow]:
    chosen = [r for r in rows if not only_wrong or not r.scores.get(PRIMARY)]
    return chosen[:max_samples] if max_samples else chosen


def write_viewer(run_dir: str | Path, out: str | Path | None = None, only_wrong: bool = False,
                 max_samples: int | None = 500) -> Path:
    run_dir = Path(run_dir)
    rows = select(read_results(run_dir), only_wrong, max_samples)
    out = Path(out) if out else run_dir / "viewer.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_page(rows, f"Trajectories · {run_dir.name}"), encoding="utf-8")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--out", default=None, help="HTML file (default: RUN_DIR/viewer.html)")
    ap.add_argument("--only-wrong", action="store_true", help="show only samples with Sub_EM 0")
    ap.add_argument("--max-samples", type=int, default=500, help="cap the page size (0 = all)")
    args = ap.parse_args(argv)
    print(write_viewer(args.run_dir, args.out, args.only_wrong, args.max_samples or None))


if __name__ == "__main__":
    main()
