"""Table 7 in miniature: one lead evaluated without and with RL, its training curve, and the
learning run's summary (recipes/train_cpu_learn.sh, `make learn`).

The paper's Table 7 is "evaluate the base and the trained checkpoint with the same eval": rows
Backbone / Method / (w/o RL, w/ RL), a column per document length, then the average. Here the
two evals are `eval.run` directories whose rows carry `variant` ("w/o RL" / "w/ RL",
`report.variant`), and the curve comes from verl's file logger (`VERL_FILE_LOGGER_PATH`, one
JSON object per step: {"step": N, "data": {metric: value}}).

    parser report runs/learn/eval --out runs/learn/report \
        --train-log runs/learn/train_metrics.jsonl --summary runs/learn/summary.json --require-learning

`summary.json` has exactly: steps, reward_first5, reward_last5, heldout_sub_em_before,
heldout_sub_em_after, heldout_questions, turns_before, turns_after. Sub_EM is in %, averaged over
samples, then runs, then lengths (the table's Avg.); turns are lead turns per held-out episode. A run
shorter than 10 steps has overlapping first and last five (the smoke's 2 steps: both are their mean).
"""
from __future__ import annotations

import collections
import json
from operator import methodcaller
from pathlib import Path
from typing import Any, Sequence

from parser.records.metrics import PRIMARY
from parser.records.metrics import mean as _mean
from parser.records.metrics import run_averaged as _run_averaged
from parser.records.result import ResultRow

WITHOUT, WITH = "w/o RL", "w/ RL"
# The curve's panels: (verl metric logged by parser.train.sampler, title).
CURVE = (("parser/reward/mean", "reward (exact match)"), ("parser/turns/mean", "lead turns per trajectory"),
         ("parser/queries_per_turn", "queries per turn"), ("parser/invalid_action_rate", "invalid-action rate"))
# What "it learned" means for the CPU run (the bar): held-out Sub_EM up by 15 points, and
# the last 5 steps' mean reward 0.2 above the first 5's.
MIN_SUB_EM_GAIN = 15.0
MIN_REWARD_GAIN = 0.2


def _method(row: ResultRow) -> str:
    """The row label without its variant suffix ("ParSer w/ RL" -> "ParSer")."""
    return row.row.removesuffix(f" {row.variant}") if row.variant else row.row


def rl_tables(rows: Sequence[ResultRow]) -> dict[str, dict[str, Any]]:
    """Per dataset: `lengths`, and `lines` = [(backbone, method, variant, {length: Sub_EM %}, avg)]."""
    groups: dict[tuple, list[ResultRow]] = collections.defaultdict(list)
    for r in rows:
        if r.variant and r.condition is None:
            groups[(r.dataset, r.backbone, _method(r), r.variant, r.length)].append(r)
    tables: dict[str, dict[str, Any]] = {}
    cells: dict[tuple, dict[int, float]] = collections.defaultdict(dict)
    for (dataset, backbone, method, variant, length), members in groups.items():
        cells[(dataset, backbone, method, variant)][length] = 100 * _run_averaged(members, methodcaller("score", PRIMARY))
    order = {WITHOUT: 0, WITH: 1}
    for (dataset, backbone, method, variant), values in sorted(cells.items(), key=lambda kv: (*kv[0][:3], order.get(kv[0][3], 2), kv[0][3])):
        table = tables.setdefault(dataset, {"lengths": set(), "lines": []})
        table["lengths"].update(values)
        table["lines"].append((backbone, method, variant, values, _mean(list(values.values()))))
    for table in tables.values():
        table["lengths"] = sorted(table["lengths"])
    return tables


def rl_markdown(tables: dict[str, dict[str, Any]]) -> str:
    """Table 7's layout: the backbone and method once per group, then one line per variant."""
    out = []
    for dataset, table in tables.items():
        header = ["Backbone", "Method", "", *(str(L) for L in table["lengths"]), "Avg."]
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        previous = None
        for backbone, method, variant, values, avg in table["lines"]:
            shown = ("", "") if (backbone, method) == previous else (backbone, method)
            previous = (backbone, method)
            cells = [f"{values[L]:.2f}" if L in values else "–" for L in table["lengths"]]
            lines.append("| " + " | ".join([*shown, variant, *cells, f"{avg:.2f}"]) + " |")
        out.append(f"## Effect of RL (Sub_EM %) · {dataset} · columns: paragraphs per document\n\n" + "\n".join(lines) + "\n")
    return "\n".join(out)


def read_train_log(path: str | Path) -> dict[int, dict[str, float]]:
    """verl's file-logger JSONL -> step -> metrics (a resumed run's repeated steps: the last wins).
    Records end at `\\n` only: `str.splitlines` also cut at U+2028, U+2029 and U+0085, which a
    JSON string may hold unescaped."""
    steps: dict[int, dict[str, float]] = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            steps[int(record["step"])] = dict(record["data"])
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}:{n}: not a verl file-logger line ({error})") from error
    if not steps:
        raise ValueError(f"{path}: no training steps logged")
    return dict(sorted(steps.items()))


def plot_training_curve(steps: dict[int, dict[str, float]], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(9, 6), sharex=True)
    for ax, (key, title) in zip(axes.flat, CURVE, strict=True):
        xs = [s for s, m in steps.items() if key in m]
        ax.plot(xs, [steps[s][key] for s in xs], "-o", markersize=3)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("GRPO step")
    fig.suptitle("CPU learning run: training curve")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def summary(rows: Sequence[ResultRow], steps: dict[int, dict[str, float]]) -> dict[str, Any]:
    """The learning run's figures (see the module docstring for the keys)."""
    rewards = [m["parser/reward/mean"] for m in steps.values() if "parser/reward/mean" in m]
    if not rewards:
        raise ValueError("no step logged parser/reward/mean (the trainer's ParserReplayBuffer writes it)")
    by_variant = {v: [r for r in rows if r.variant == v and r.condition is None] for v in (WITHOUT, WITH)}
    missing = [v for v, members in by_variant.items() if not members]
    if missing:
        raise ValueError(f"no eval rows with variant {missing} (run eval.run with report.variant=...)")

    def sub_em(members: list[ResultRow]) -> float:
        by_length: dict[int, list[ResultRow]] = collections.defaultdict(list)
        for r in members:
            by_length[r.length].append(r)
        return round(100 * _mean([_run_averaged(v, methodcaller("score", PRIMARY)) for v in by_length.values()]), 2)

    questions = {v: {r.question for r in members} for v, members in by_variant.items()}
    if questions[WITHOUT] != questions[WITH]:
        raise ValueError("the w/o RL and w/ RL evals ran on different questions; compare them on the same set")
    return {
        "steps": max(steps),
        "reward_first5": round(_mean(rewards[:5]), 4),
        "reward_last5": round(_mean(rewards[-5:]), 4),
        "heldout_sub_em_before": sub_em(by_variant[WITHOUT]),
        "heldout_sub_em_after": sub_em(by_variant[WITH]),
        "heldout_questions": len(questions[WITH]),
        "turns_before": round(_mean([float(r.steps) for r in by_variant[WITHOUT]]), 3),
        "turns_after": round(_mean([float(r.steps) for r in by_variant[WITH]]), 3),
    }


def learning_failures(figures: dict[str, Any]) -> list[str]:
    """What falls short of the bar (empty: it learned)."""
    problems = []
    gain = figures["heldout_sub_em_after"] - figures["heldout_sub_em_before"]
    if not gain >= MIN_SUB_EM_GAIN:
        problems.append(f"held-out Sub_EM rose {gain:.2f} points (< {MIN_SUB_EM_GAIN})")
    reward_gain = figures["reward_last5"] - figures["reward_first5"]
    if not reward_gain >= MIN_REWARD_GAIN:
        problems.append(f"mean reward of the last 5 steps rose {reward_gain:.3f} over the first 5 (< {MIN_REWARD_GAIN})")
    return problems
