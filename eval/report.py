"""Build the paper's tables and figures from eval run directories.

Reads every `results.jsonl` / `timings.jsonl` under the given paths (run directories of
`parser eval`, or folders holding several) and writes to `--out`:

- `accuracy.{md,tex,csv}`: Table 1 / Table 7 layout, rows = backbone x method, columns =
  lengths (paragraphs, ~tokens), then Max δ (max - min over lengths) and Avg. Each cell is the
  Sub_EM % (`--metric`: any metric a row carries, e.g. sub_em_compat, MemAgent's and ReMemR1's
  scorer; their rows are labelled with it) averaged over samples, then over runs; in Markdown and
  LaTeX followed by its spread over runs (± std) and, for a row with fewer samples than the
  fullest one, (n/N); the sample and run counts are listed under each table; bold marks a
  column's one best row (no tie).
  `--paper` adds the published row under ours.

Nothing is pooled silently: run directories whose rows share a table row but were computed with
other method or model settings (their manifests) become separate rows labelled with the keys that
differ, and the same sample in two run directories is refused, naming both. No impossible number
is shown: a rate outside [0, 1] is refused naming its row, a null metric is scored from the row's
prediction (and said), and a run directory holding fewer samples than its manifest expected is
labelled `(partial: n of N samples)` in every table it appears in. A missing or empty directory, a
duplicate sample, a bad row or a bad `--out` ends in one line, exit 2.
- `latency.{md,csv}`: amortized seconds per sample (subset wall time / subset size, summed over
  runs and resumed sessions) and mean sequential steps, per concurrency (Table 2, Figure 3),
  with baseline/ParSer speedups; where a folder holds the latency bench's `floor.jsonl` (the
  document read once, scripts/bench_latency.py), each method's time over that floor, and the
  speedup figure draws the floor (each baseline's time over it: the speedup of a method that
  took no longer than reading once).
- `tokens.{md,csv}`: mean output tokens per sample, lead and subagents (Table 6).
- `cost.{md,csv}`: accuracy beside what it cost, per row and length: mean steps (calls on the
  critical path), sub-calls (ParSer's subagent requests, RLM's llm_query prompts), InfMem's planner
  calls and how often it stopped early, and mean seconds per sample, read from each row's trace
  (`trace_costs`); the peers grid (configs/eval/peers.yaml) sets RLM and InfMem beside ParSer with it.
- `lead_prompt.md`: the lead's prompt tokens turn by turn (from saved records): ParSer's grows
  with its history, LongHarness's stays within its state budget.
- `controlled.{md,csv}`: Sub_EM per condition for the controlled sets (Figure 2), with each
  method's spread (max − min over the set's conditions), and `sensitivity.{md,csv}`: the spreads
  alone, one row per method, one column per analysis (position, order, distance).
- `reading.{md,csv}`: for the sequential readers, at which step of their pass the evidence was
  read, and how many chunks apart (model-free: what the chunk order does).
- `figures/*.png`: accuracy vs length, each controlled analysis, all of them side by side
  (`controlled_sensitivity.png`, the paper's Figure 2 layout), speedup and steps vs length.
- `viewer/*.html`: the trajectory viewer of every run directory (`eval.viewer`).
- `rl.md`: Table 7's layout (w/o RL / w/ RL sub-rows) when rows carry a `variant`; with
  `--train-log`, `figures/training_curve.png` and (`--summary`) the learning run's
  `summary.json` (`eval.learning`).
- `report.md`: all tables in one page, with the figure paths.

    parser report outputs/eval/hqa_parser4b outputs/eval/hqa_memagent4b --out reports/hqa --paper
    parser report outputs/eval/hqa_memagent4b --out reports/hqa_theirs --metric sub_em_compat   # the authors' scoring
    parser report runs/learn/eval --out runs/learn/report --train-log runs/learn/train_metrics.jsonl \
        --summary runs/learn/summary.json --require-learning     # Table 7 in miniature (make learn)
"""
from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import io
import json
import math
import os
import re
import statistics
import sys
from operator import methodcaller
from pathlib import Path
from typing import Any, Iterable, Sequence

from eval import learning, paper_numbers
from eval.latency import read_floors
from parser.records.metrics import BY_NAME, METRICS, PRIMARY, completion_text, run_averaged, score
from parser.records.metrics import mean as _mean
from eval.provenance import ManifestDamaged, read_manifest
from eval.store import RESULTS, read_results, read_timings
from parser.records.result import ResultRow, TimingLine
from parser.records.trace import SequentialTrace, Trace
from parser.records.trajectory import Trajectory

MARKERS = ("o", "s", "^", "D", "v", "x", "P", "*")
DASHES = ("-", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1)))
DATASET_TITLES = {"hotpotqa": "HotpotQA", "2wikimultihopqa": "2WikiMultiHopQA", "synthetic": "Synthetic world"}


# ----------------------------------------------------------------------------- loading

def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    dirs: set[Path] = set()
    for p in map(Path, paths):
        found = [p] if (p / RESULTS).exists() else [f.parent for f in p.rglob(RESULTS)] if p.is_dir() else []
        if not found:  # a typo, or an empty folder: named, not reported as nothing
            raise FileNotFoundError(f"{p}: {'no such directory' if not p.exists() else f'no {RESULTS} here or below'}; "
                                    "pass an eval run directory")
        dirs.update(found)
    return sorted(dirs)


def load(run_dirs: Sequence[Path]) -> tuple[list[ResultRow], list[TimingLine]]:
    """Every run directory's rows and timings, never silently pooled: run directories whose rows
    share a table row but were computed with other settings (their manifests' `method` and
    `models` sections) become separate rows, labelled with the keys that differ; the same sample
    key in two directories is refused, naming both."""
    per_dir = [(d, vetted(d, read_results(d)), vetted_timings(d, read_timings(d))) for d in run_dirs]
    labels = _split_labels({d: _settings(d) for d in run_dirs}, {d: rows for d, rows, _ in per_dir})
    marks = {d: partial_mark(d, dir_rows) for d, dir_rows, _ in per_dir}
    rows: list[ResultRow] = []
    timings: list[TimingLine] = []
    seen: dict[tuple, Path] = {}
    for d, dir_rows, dir_timings in per_dir:
        relabel, mark = labels.get(d, {}), marks[d]
        for r in dir_rows:
            label = relabel.get(r.row, r.row)  # a partial copy of a run is still the same run: the key has no mark
            key = (r.backbone, label, r.concurrency, *r.key)  # one sample timed at two concurrencies is two measurements
            if key in seen:
                raise ValueError(f"sample {r.sample_id!r} ({r.dataset}, L={r.length}, run {r.run}, row {label!r}) is in "
                                 f"both {seen[key]} and {d}: a table would count it twice; report one of them, or tell "
                                 "them apart with report.variant")
            seen[key] = d
            rows.append(dataclasses.replace(r, row=label + mark))
        timings += [dataclasses.replace(t, row=relabel.get(t.row, t.row) + mark) for t in dir_timings]
    return rows, timings


def vetted(run_dir: Path, rows: list[ResultRow]) -> list[ResultRow]:
    """A run directory's rows as the tables may use them. A rate (a metric the report prints as a
    percentage) outside [0, 1] cannot be: it is refused naming the row, never averaged into a cell.
    A metric that is null (a row written before the metric existed, or edited) is scored again
    from the row's prediction and answers, as eval.run scores it, and said once per directory."""
    out, filled = [], collections.Counter()
    for r in rows:
        where = f"{run_dir / RESULTS}: row {r.sample_id!r} ({r.dataset}, L={r.length}, run {r.run}, row {r.row!r})"
        for name, value in r.scores.items():
            if BY_NAME[name].percent and not 0.0 <= value <= 1.0:
                raise ValueError(f"{where}: {name} = {value!r} is outside [0, 1], which no rate can be; fix or remove that line")
        for name in ("steps", "wall_s", "lead_output_tokens", "subagent_output_tokens"):  # the latency and token tables'
            if getattr(r, name) < 0:
                raise ValueError(f"{where}: {name} = {getattr(r, name)!r} is negative; fix or remove that line")
        missing = [m.name for m in METRICS if m.name not in r.scores]
        if missing:
            rescored = score(r.prediction, r.answers, completion_text(r.trace))
            r = dataclasses.replace(r, scores={**r.scores, **{name: rescored[name] for name in missing}})
            filled.update(missing)
        out.append(r)
    if filled:
        print(f"[report] {run_dir}: " + ", ".join(f"{n} rows had no {name} (null)" for name, n in sorted(filled.items()))
              + "; scored from their prediction and answers")
    return out


def vetted_timings(run_dir: Path, timings: list[TimingLine]) -> list[TimingLine]:
    """A subset pass's wall time and sample count, which the latency table divides: never negative."""
    for t in timings:
        if t.wall_s < 0 or t.samples < 0:
            raise ValueError(f"{run_dir}/timings.jsonl: {t.dataset} L={t.length} run {t.run} session {t.session!r}: "
                             f"wall_s = {t.wall_s!r}, samples = {t.samples!r}; neither can be negative")
    return timings


def partial_mark(run_dir: Path, rows: Sequence[ResultRow]) -> str:
    """" (partial: n of N samples)" for a run directory holding fewer rows than its run expected
    (the manifest's latest `expected`: every dataset x length x run key), appended to the row
    label so that every table the run appears in says so; "" for a complete run, or one whose
    manifest does not say."""
    try:
        sessions = (read_manifest(run_dir) or {}).get("sessions") or []
    except ManifestDamaged:  # `_settings` has said so
        return ""
    expected = next((s["expected"] for s in reversed(sessions) if isinstance(s.get("expected"), int)), None)
    done = len({r.key for r in rows})
    return f" (partial: {done} of {expected} samples)" if expected and done < expected else ""


def _settings(run_dir: Path) -> dict[str, str]:
    """What decides a run's numbers besides its samples: the method and models sections of its
    manifest's config, flattened to dotted keys (the table label itself left out)."""
    try:
        config = (read_manifest(run_dir) or {}).get("config") or {}
    except ManifestDamaged as error:  # its rows are still reported; only their settings are unknown
        print(f"[report] warning: {error}")
        config = {}
    if not isinstance(config, dict):
        config = {}
    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}", inner)
        else:
            flat[prefix] = json.dumps(value, sort_keys=True, default=str)

    for section in ("method", "models"):
        walk(section, config.get(section))
    flat.pop("method.label", None)
    return flat


def _split_labels(settings: dict[Path, dict[str, str]], rows: dict[Path, list[ResultRow]]) -> dict[Path, dict[str, str]]:
    """run dir -> {row label: label with the differing settings} for table rows that several run
    directories with different settings share (`ParSer [method.episode.max_turns=2]`)."""
    dirs_of: dict[tuple, list[Path]] = collections.defaultdict(list)
    for d, dir_rows in rows.items():
        for key in sorted({(r.dataset, r.backbone, r.row) for r in dir_rows}):
            dirs_of[key].append(d)
    labels: dict[Path, dict[str, str]] = collections.defaultdict(dict)
    for (_, _, row), dirs in dirs_of.items():
        keys = sorted({k for d in dirs for k in settings[d]})
        differing = [k for k in keys if len({settings[d].get(k) for d in dirs}) > 1]
        if len(dirs) < 2 or not differing:
            continue
        for d in dirs:
            shown = ", ".join(f"{k}={json.loads(settings[d][k]) if k in settings[d] else '–'}" for k in differing[:3])
            labels[d][row] = f"{row} [{shown}{', …' if len(differing) > 3 else ''}]"
    return labels


# ----------------------------------------------------------------------------- accuracy

def accuracy_cells(rows: Sequence[ResultRow], metric: str = PRIMARY) -> dict[tuple[str, str, str], dict[int, dict[str, Any]]]:
    """(dataset, backbone, row) -> length -> {value (% if the metric is a percentage), n samples per run, runs}."""
    scale = 100 if BY_NAME[metric].percent else 1
    groups: dict[tuple[str, str, str, int], list[ResultRow]] = collections.defaultdict(list)
    for r in rows:
        if r.condition is None:
            groups[(r.dataset, r.backbone, r.row, r.length)].append(r)
    cells: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = collections.defaultdict(dict)
    for (dataset, backbone, row, length), members in sorted(groups.items()):
        runs = sorted({m.run for m in members})
        per_run = [run_averaged([m for m in members if m.run == run], methodcaller("score", metric)) for run in runs]
        cells[(dataset, backbone, row)][length] = {
            "value": scale * run_averaged(members, methodcaller("score", metric)), "n": len(members) // max(len(runs), 1), "runs": len(runs),
            "std": scale * statistics.stdev(per_run) if len(per_run) > 1 else None}
    return dict(cells)


def max_delta_avg(values: Sequence[float]) -> tuple[float, float]:
    return (max(values) - min(values), _mean(values)) if values else (math.nan, math.nan)


# Methods whose published numbers come from their authors' scorer: their rows name the metric
# they were computed with (`--metric sub_em_compat` is MemAgent's and ReMemR1's; docs/fidelity.md row 35).
AUTHORS_SCORED = ("memagent", "rememr1")


def accuracy_table(rows: Sequence[ResultRow], with_paper: bool, metric: str = PRIMARY) -> dict[str, dict[str, Any]]:
    """Per dataset: `lengths`, and `lines` = [(backbone, label, {length: value}, max δ, avg, note)];
    a MemAgent or ReMemR1 row is labelled with the metric's title ("MemAgent [Sub_EM, authors' scorer]")."""
    cells = accuracy_cells(rows, metric)
    scored = {(r.dataset, r.backbone, r.row) for r in rows if r.method in AUTHORS_SCORED}
    tables: dict[str, dict[str, Any]] = {}
    for (dataset, backbone, row), by_length in cells.items():
        table = tables.setdefault(dataset, {"lengths": set(), "lines": []})
        table["lengths"].update(by_length)
        values = {L: c["value"] for L, c in by_length.items()}
        runs = sorted({c["runs"] for c in by_length.values()})
        n = sorted({c["n"] for c in by_length.values()})
        label = f"{row} [{BY_NAME[metric].title}]" if (dataset, backbone, row) in scored else row
        table["lines"].append((backbone, label, values, *max_delta_avg(list(values.values())),
                               f"ours; {'/'.join(map(str, n))} samples x {'/'.join(map(str, runs))} runs"))
        table.setdefault("cells", {})[(backbone, label)] = by_length
        published = paper_numbers.published(dataset, backbone, row) if with_paper else None
        if published:
            shown = {L: published[L] for L in values if L in published}
            table["lines"].append((backbone, f"{row} (paper)", shown, *max_delta_avg(list(shown.values())),
                                   "published, same lengths"))
    for table in tables.values():
        table["lengths"] = sorted(table["lengths"])
        cells = table.get("cells", {})
        table["complete"] = {L: max((c[L]["n"] for c in cells.values() if L in c), default=0) for L in table["lengths"]}
    return tables


def _fmt(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def _length_header(L: int, dataset: str = "") -> str:
    """Paragraph count, plus the paper's approximate token length for its own datasets."""
    if dataset in paper_numbers.SUB_EM and L in paper_numbers.TOKENS:
        return f"{L} ({paper_numbers.TOKENS[L]})"
    return str(L)


def _notes(table: dict[str, Any]) -> str:
    """Under each accuracy table: how many samples and runs stand behind each of our rows."""
    lines = [f"- {label} · {backbone}: {note.removeprefix('ours; ')}" for backbone, label, _, _, _, note in table["lines"]
             if note.startswith("ours")]
    return ("Each value: mean over samples, then over runs, ± the standard deviation over runs; (n/N): this row has n "
            "samples per run at that length where the fullest row has N. Bold: the one best row of a column (none on "
            "a tie).\n\n" + "\n".join(lines) + "\n")


def table_to_markdown(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n"


def _latex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                 ("δ", r"$\delta$"), ("–", "--")):
        text = text.replace(a, b)
    return text


def table_to_latex(header: Sequence[str], body: Sequence[Sequence[str]], caption: str) -> str:
    cols = "ll" + "r" * (len(header) - 2)
    out = [r"\begin{table}[t]", r"\centering", rf"\caption{{{_latex_escape(caption)}}}", rf"\begin{{tabular}}{{{cols}}}",
           r"\toprule", " & ".join(_latex_escape(h) for h in header) + r" \\", r"\midrule"]
    out += [" & ".join(_latex_escape(c) for c in row) + r" \\" for row in body]
    out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(out) + "\n"


def table_to_csv(header: Sequence[str], body: Sequence[Sequence[str]], extra: Sequence[str] = ()) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow((["dataset"] if extra else []) + list(header))
    for row in body:
        writer.writerow([*extra, *row])
    return buf.getvalue()


def best_per_length(table: dict[str, Any], metric: str = PRIMARY) -> dict[int, float]:
    """The best of our values in each length column (the metric says which direction is better),
    for columns where one row alone holds it: a tie (0.00 everywhere, say) marks no winner."""
    pick = max if BY_NAME[metric].higher_is_better else min
    ours = [values for _, _, values, _, _, note in table["lines"] if note.startswith("ours")]
    best = {}
    for L in table["lengths"]:
        column = [v[L] for v in ours if L in v]
        if len(column) > 1 and column.count(pick(column)) == 1:
            best[L] = pick(column)
    return best


def accuracy_rows(table: dict[str, Any], dataset: str, bold: dict[int, float] | None = None,
                  detail: bool = False) -> tuple[list[str], list[list[str]]]:
    """Header and body; values equal to `bold[length]` are marked `**x**` (Markdown only).
    `detail`: each of our values followed by its spread over runs (`± std`) and, where the row
    has fewer samples at that length than the fullest row, `(n/N)`: a partial run is never
    read as a complete one."""
    lengths = table["lengths"]
    header = ["Backbone", "Method", *(_length_header(L, dataset) for L in lengths), "Max δ", "Avg."]
    cells, complete = table.get("cells", {}), table.get("complete", {})

    def cell(backbone: str, label: str, values: dict[int, float], L: int, ours: bool) -> str:
        text = _fmt(values.get(L))
        if detail and ours and L in values and (backbone, label) in cells:
            info = cells[(backbone, label)][L]
            text += f" ± {info['std']:.2f}" if info.get("std") is not None else ""
            text += f" ({info['n']}/{complete[L]})" if info["n"] < complete.get(L, 0) else ""
        return f"**{text}**" if bold and ours and L in values and values[L] == bold.get(L) else text

    body = [[backbone, label, *(cell(backbone, label, values, L, note.startswith("ours")) for L in lengths),
             _fmt(delta), _fmt(avg)]
            for backbone, label, values, delta, avg, note in table["lines"]]
    return header, body


# ----------------------------------------------------------------------------- latency, tokens

def latency_table(rows: Sequence[ResultRow], timings: Sequence[TimingLine]) -> list[dict[str, Any]]:
    """Amortized s/sample = sum of subset wall times / samples they finished; steps from rows.

    A subset session that finished wrote a timing line. One that was killed did not; its rows
    (same `session`) are timed from the first sample's start (`finished_at - wall_s`) to the
    last one's finish, so every finished sample is counted once, whichever session ran it.
    """
    wall: dict[tuple, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for t in timings:
        if t.condition is None and t.samples:
            key = (t.dataset, t.backbone, t.row, t.concurrency, t.length)
            wall[key][0] += t.wall_s
            wall[key][1] += t.samples
    timed_sessions = {t.session for t in timings if t.session}
    killed: dict[tuple, list[ResultRow]] = collections.defaultdict(list)
    for r in rows:
        if r.condition is None and r.session and r.session not in timed_sessions and r.finished_at is not None:
            killed[(r.session, r.dataset, r.backbone, r.row, r.concurrency, r.length)].append(r)
    for (_, *key), session_rows in killed.items():
        started = min(r.finished_at - r.wall_s for r in session_rows)
        wall[tuple(key)][0] += max(r.finished_at for r in session_rows) - started
        wall[tuple(key)][1] += len(session_rows)
    steps: dict[tuple, list[float]] = collections.defaultdict(list)
    for r in rows:
        if r.condition is None:
            steps[(r.dataset, r.backbone, r.row, r.length)].append(float(r.steps))
    return [{"dataset": d, "backbone": b, "row": m, "concurrency": c, "length": L,
             "amortized_s": total / n, "samples": n, "steps": _mean(steps.get((d, b, m, L), []))}
            for (d, b, m, c, L), (total, n) in sorted(wall.items())]


def speedups(latency: Sequence[dict[str, Any]], parser_row: str = "ParSer") -> list[dict[str, Any]]:
    """Every other method's amortized time / ParSer's, per (dataset, backbone, concurrency, length)."""
    ours = {(e["dataset"], e["backbone"], e["concurrency"], e["length"]): e for e in latency if e["row"] == parser_row}
    out = []
    for e in latency:
        base = ours.get((e["dataset"], e["backbone"], e["concurrency"], e["length"]))
        if base and e["row"] != parser_row:
            paper = paper_numbers.SPEEDUP_C1.get(e["length"]) if (e["dataset"], e["row"], e["concurrency"]) == ("hotpotqa", "MemAgent", 1) else None
            out.append({**{k: e[k] for k in ("dataset", "backbone", "concurrency", "length")}, "baseline": e["row"],
                        "speedup": e["amortized_s"] / base["amortized_s"], "steps_ratio": e["steps"] / base["steps"],
                        "paper_speedup": paper})
    return out


def trace_costs(trace: Trace | None) -> dict[str, float]:
    """The counts a row's trace holds beyond `steps`: `sub_calls` for an episode (RLM: its sub-model
    calls, `record.rlm.usage.sub`; any other: its subagent requests), `plans` and `stopped_early` for
    InfMem's pass (its planner calls); {} for a row saved without its trace or a method with neither."""
    if isinstance(trace, Trajectory):
        return {"sub_calls": float(trace.sub_calls)}
    if isinstance(trace, SequentialTrace) and trace.planner_calls is not None:
        return {"plans": float(trace.planner_calls), "stopped_early": float(trace.stopped_early)}
    return {}


def cost_table(rows: Sequence[ResultRow], metric: str = PRIMARY) -> list[dict[str, Any]]:
    """Per (dataset, backbone, row, length): accuracy (`metric`, as the accuracy table averages it),
    mean steps, mean wall seconds per sample, and the means of `trace_costs` over the rows that hold
    each count (None where none does: printed "–", never 0)."""
    accuracy = accuracy_cells(rows, metric)
    groups: dict[tuple, list[ResultRow]] = collections.defaultdict(list)
    for r in rows:
        if r.condition is None:
            groups[(r.dataset, r.backbone, r.row, r.length)].append(r)
    table = []
    for (d, b, m, L), g in sorted(groups.items()):
        costs = [trace_costs(r.trace) for r in g]
        known = {name: [c[name] for c in costs if name in c] for name in ("sub_calls", "plans", "stopped_early")}
        table.append({"dataset": d, "backbone": b, "row": m, "length": L, "samples": len(g),
                      "accuracy": accuracy[(d, b, m)][L]["value"],
                      "steps": _mean([float(r.steps) for r in g]), "wall_s": _mean([r.wall_s for r in g]),
                      **{name: _mean(values) if values else None for name, values in known.items()}})
    return table


def floor_table(latency: Sequence[dict[str, Any]], floors: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each latency entry with a floor at its (dataset, backbone, length): its time over the floor."""
    by = {(f["dataset"], f["backbone"], f["length"]): f["seconds"] for f in floors}
    return [{**e, "floor_s": by[key], "x_floor": e["amortized_s"] / by[key]} for e in latency
            if (key := (e["dataset"], e["backbone"], e["length"])) in by and by[key] > 0]


def token_table(rows: Sequence[ResultRow]) -> list[dict[str, Any]]:
    groups: dict[tuple, list[ResultRow]] = collections.defaultdict(list)
    for r in rows:
        if r.condition is None:
            groups[(r.dataset, r.backbone, r.row, r.length)].append(r)
    return [{"dataset": d, "backbone": b, "row": m, "length": L,
             "lead": _mean([r.lead_output_tokens for r in g]),
             "subagents": _mean([r.subagent_output_tokens for r in g]),
             "total": _mean([r.lead_output_tokens + r.subagent_output_tokens for r in g])}
            for (d, b, m, L), g in sorted(groups.items())]


def lead_prompt_table(rows: Sequence[ResultRow]) -> list[dict[str, Any]]:
    """The lead's prompt per turn, from saved records (`Turn.prompt_tokens`): how it grows with
    the rounds (ParSer's appended history) or stays within a budget (LongHarness's state).
    Rows without an episode's trace are left out; groups with none are not listed."""
    groups: dict[tuple, list[list[int]]] = collections.defaultdict(list)
    for r in rows:
        if r.condition is None and isinstance(r.trace, Trajectory) and r.trace.turns:
            groups[(r.dataset, r.backbone, r.row, int(r.length))].append([t.prompt_tokens for t in r.trace.turns])
    table = []
    for (d, b, m, L), samples in sorted(groups.items()):
        depth = max(len(s) for s in samples)
        by_turn = [_mean([s[i] for s in samples if len(s) > i]) for i in range(depth)]
        table.append({"dataset": d, "backbone": b, "row": m, "length": L, "turns": _mean([len(s) for s in samples]),
                      "by_turn": by_turn, "max": max(max(s) for s in samples)})
    return table


ANALYSES = {"position": "evidence position (window start, percentile)", "order": "evidence order",
            "distance": "evidence distance (paragraphs between)"}


def analysis_of(dataset: str, rows: Sequence[ResultRow]) -> str:
    """Which factor a controlled set varies: the rows' `meta.control` (data_prep.controlled), else the name's suffix."""
    for r in rows:
        if r.control:
            return r.control
    return next((a for a in ANALYSES if dataset.endswith(a)), dataset)


def controlled_table(rows: Sequence[ResultRow]) -> dict[str, dict[str, Any]]:
    """dataset -> {analysis, conditions (ordered), lines: {(backbone, row): {condition: Sub_EM %}},
    spread: {(backbone, row): max − min over the conditions it has}}."""
    groups: dict[tuple, list[ResultRow]] = collections.defaultdict(list)
    order: dict[str, dict[str, int]] = collections.defaultdict(dict)
    by_dataset: dict[str, list[ResultRow]] = collections.defaultdict(list)
    for r in rows:
        if r.condition is not None:
            groups[(r.dataset, r.backbone, r.row, r.condition)].append(r)
            order[r.dataset][r.condition] = r.condition_index or 0
            by_dataset[r.dataset].append(r)
    out: dict[str, dict[str, Any]] = {}
    for (d, b, m, cond), members in groups.items():
        table = out.setdefault(d, {"analysis": analysis_of(d, by_dataset[d]), "conditions": sorted(order[d], key=order[d].get),
                                   "lines": {}})
        table["lines"].setdefault((b, m), {})[cond] = (100 if BY_NAME[PRIMARY].percent else 1) * run_averaged(members, methodcaller("score", PRIMARY))
    for table in out.values():
        table["spread"] = {line: max_delta_avg(list(values.values()))[0] for line, values in table["lines"].items()}
    rank = list(ANALYSES)  # the paper's panel order: position, order, distance
    return dict(sorted(out.items(), key=lambda kv: (rank.index(kv[1]["analysis"]) if kv[1]["analysis"] in rank else len(rank), kv[0])))


def sensitivity_rows(controlled: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and body: one row per (backbone, method), the spread per controlled set (lower: less sensitive)."""
    datasets = list(controlled)
    lines = list(dict.fromkeys(line for d in datasets for line in controlled[d]["spread"]))
    header = ["Backbone", "Method", *(f"{controlled[d]['analysis']} ({d})" for d in datasets)]
    return header, [[b, m, *(_fmt(controlled[d]["spread"].get((b, m))) for d in datasets)] for b, m in lines]


def evidence_reading(rows: Sequence[ResultRow]) -> list[dict[str, Any]]:
    """When a sequential reader read the evidence, per (dataset, backbone, row, condition).

    From each row's reading order and the paragraphs in each chunk (`parser.methods.sequential`)
    and its gold paragraphs: `first` / `last` = the reading step of the first / last gold chunk as
    a fraction of the pass (0 = read first, 1 = read last), `gap` = chunks read from the first
    gold chunk to the last, `in_order` = the fraction of samples whose gold chunks were read in
    the reasoning order (`evidence_order`; a chunk holding two of them reads both at once).
    Model-free: it is what the order does, whatever the model answers."""
    groups: dict[tuple, list[tuple[float, float, int, float]]] = collections.defaultdict(list)
    chunks: dict[tuple, list[int]] = collections.defaultdict(list)
    for r in rows:
        trace, gold = r.trace, r.gold_paragraph_ids
        if not isinstance(trace, SequentialTrace) or not gold:
            continue
        step = {chunk: k for k, chunk in enumerate(trace.reading_order)}
        holder = {pid: c for c, pids in enumerate(trace.chunk_paragraphs) for pid in pids}
        steps = sorted(step[holder[g]] for g in gold if g in holder)
        if not steps:
            continue
        last_step = max(len(trace.reading_order) - 1, 1)
        chain = [step[holder[g]] for g in (r.evidence_order or gold) if g in holder]
        key = (r.dataset, r.backbone, r.row, r.condition)
        groups[key].append((steps[0] / last_step, steps[-1] / last_step, steps[-1] - steps[0], float(chain == sorted(chain))))
        chunks[key].append(len(trace.reading_order))
    return [{"dataset": d, "backbone": b, "row": m, "condition": c, "samples": len(v), "chunks": _mean(chunks[(d, b, m, c)]),
             "first": _mean([x[0] for x in v]), "last": _mean([x[1] for x in v]), "gap": _mean([x[2] for x in v]),
             "in_order": _mean([x[3] for x in v])}
            for (d, b, m, c), v in groups.items()]


# ----------------------------------------------------------------------------- figures

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(tables: dict[str, dict[str, Any]], fig_dir: Path) -> list[Path]:
    plt = _plt()
    paths = []
    for dataset, table in tables.items():
        fig, ax = plt.subplots(figsize=(6.4, 4))
        for i, (backbone, label, values, *_) in enumerate(table["lines"]):
            xs = sorted(values)
            # each line its own marker, dash and (shrinking) size: a line lying exactly on another stays visible
            marker, dash = MARKERS[i % len(MARKERS)], DASHES[i % len(DASHES)]
            ax.plot(xs, [values[x] for x in xs], linestyle="--" if label.endswith("(paper)") else dash, marker=marker,
                    markersize=max(9 - 1.5 * i, 3), markerfacecolor="none" if i % 2 == 0 else None,
                    label=f"{label} · {backbone}", alpha=0.6 if label.endswith("(paper)") else 0.9)
        ax.set_xscale("log", base=2)
        ax.set_xticks(table["lengths"], [_length_header(L, dataset) for L in table["lengths"]], rotation=30, fontsize=8)
        ax.set_xlabel("document length (paragraphs)")
        ax.set_ylabel("Sub_EM (%)")
        ax.set_ylim(0, 100)
        ax.set_title(f"Accuracy vs length · {DATASET_TITLES.get(dataset, dataset)}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(_save(fig, fig_dir / f"accuracy_vs_length_{dataset}.png"))
    return paths


def _controlled_panel(ax: Any, dataset: str, table: dict[str, Any]) -> None:
    conds = table["conditions"]
    for (backbone, label), values in table["lines"].items():
        spread = table["spread"][(backbone, label)]
        ax.plot(range(len(conds)), [values.get(c, math.nan) for c in conds], "-o", label=f"{label} · {backbone} (Δ {_fmt(spread)})")
    ax.set_xticks(range(len(conds)), conds, rotation=30, fontsize=8)
    ax.set_xlabel(ANALYSES.get(table["analysis"], table["analysis"]), fontsize=8)
    ax.set_ylabel("Sub_EM (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"{table['analysis'].capitalize()} · {dataset}", fontsize=9)
    ax.legend(fontsize=6)


def plot_controlled(controlled: dict[str, dict[str, Any]], fig_dir: Path) -> list[Path]:
    """One figure per controlled set and, with several, all side by side (Δ = the spread)."""
    plt = _plt()
    paths = []
    for dataset, table in controlled.items():
        fig, ax = plt.subplots(figsize=(6.4, 4))
        _controlled_panel(ax, dataset, table)
        fig.tight_layout()
        paths.append(_save(fig, fig_dir / f"controlled_{dataset}.png"))
    if len(controlled) > 1:
        fig, axes = plt.subplots(1, len(controlled), figsize=(5.2 * len(controlled), 4.2), squeeze=False)
        for ax, (dataset, table) in zip(axes[0], controlled.items(), strict=True):
            _controlled_panel(ax, dataset, table)
        fig.suptitle("Accuracy under controlled evidence: position, order, distance")
        fig.tight_layout()
        paths.append(_save(fig, fig_dir / "controlled_sensitivity.png"))
    return paths


def plot_latency(latency: Sequence[dict[str, Any]], speed: Sequence[dict[str, Any]], fig_dir: Path,
                 over_floor: Sequence[dict[str, Any]] = ()) -> list[Path]:
    plt = _plt()
    paths = []
    if speed:
        fig, ax = plt.subplots(figsize=(6.4, 4))
        series: dict[tuple, dict[int, float]] = collections.defaultdict(dict)
        for s in speed:
            series[(s["dataset"], s["backbone"], s["baseline"], s["concurrency"])][s["length"]] = s["speedup"]
        ceiling: dict[tuple, dict[int, float]] = collections.defaultdict(dict)
        for e in over_floor:  # a baseline's time over the floor: the speedup of a method as fast as reading once
            ceiling[(e["dataset"], e["backbone"], e["row"], e["concurrency"])][e["length"]] = e["x_floor"]
        for (d, b, base, c), values in series.items():
            xs = sorted(values)
            line, = ax.plot(xs, [values[x] for x in xs], "-o", label=f"{base} / ParSer · {b} · {d} · conc {c}")
            floor = ceiling.get((d, b, base, c))
            if floor:
                fx = sorted(floor)
                ax.plot(fx, [floor[x] for x in fx], ":x", color=line.get_color(), label=f"{base} / floor (reading once)")
        if any(s["paper_speedup"] for s in speed):
            xs = sorted(paper_numbers.SPEEDUP_C1)
            ax.plot(xs, [paper_numbers.SPEEDUP_C1[x] for x in xs], "--", alpha=0.6, label="MemAgent / ParSer (paper, conc 1)")
        ax.axhline(1.0, color="grey", lw=0.8)
        _length_axis(ax, [s["length"] for s in speed])
        ax.set_ylim(bottom=0)
        ax.set_ylabel("speedup (x, amortized s/sample)")
        ax.set_title("Speedup vs length")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(_save(fig, fig_dir / "speedup_vs_length.png"))
    if latency:
        fig, ax = plt.subplots(figsize=(6.4, 4))
        series = collections.defaultdict(dict)
        for e in latency:
            series[(e["dataset"], e["backbone"], e["row"])][e["length"]] = e["steps"]
        for (d, b, m), values in series.items():
            xs = sorted(values)
            ax.plot(xs, [values[x] for x in xs], "-o", label=f"{m} · {b} · {d}")
        _length_axis(ax, [e["length"] for e in latency])
        ax.set_ylim(bottom=0)
        ax.set_ylabel("sequential steps per sample")
        ax.set_title("Inference steps vs length")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(_save(fig, fig_dir / "steps_vs_length.png"))
    return paths


def _length_axis(ax: Any, lengths: Iterable[int]) -> None:
    """Log-2 length axis ticked at the measured lengths (the paper's lengths double)."""
    ticks = sorted(set(lengths))
    ax.set_xscale("log", base=2)
    ax.minorticks_off()
    ax.set_xticks(ticks, [str(t) for t in ticks], fontsize=8)
    ax.set_xlabel("document length (paragraphs)")


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- main

def build_report(paths: Sequence[str | Path], out: str | Path, with_paper: bool = False, viewer: bool = True,
                 train_log: str | Path | None = None, metric: str = PRIMARY) -> dict[str, Any]:
    """Every table and figure of the module docstring; `metric` (a `parser.records.metrics` name)
    fills the accuracy tables (Table 1), e.g. sub_em_compat for the authors' scoring."""
    if metric not in BY_NAME:
        raise ValueError(f"metric must be one of {', '.join(BY_NAME)}, got {metric!r}")
    run_dirs = find_run_dirs(paths)
    out = prepare_out(out)
    rows, timings = load(run_dirs)
    if not rows:
        raise ValueError(f"no result rows under {', '.join(map(str, paths))}")
    sections = [f"# Eval report\n\nRun directories: {', '.join(f'`{d}`' for d in run_dirs)}\n"
                f"\nAccuracy: {BY_NAME[metric].title}{' (%)' if BY_NAME[metric].percent else ''}, mean over samples then over runs; "
                f"Max δ = max − min over lengths.\n"]

    tables = accuracy_table(rows, with_paper, metric)
    md, tex, csv_parts = [], [], []
    for dataset, table in tables.items():
        header, body = accuracy_rows(table, dataset)
        title = f"Accuracy ({BY_NAME[metric].title}{' %' if BY_NAME[metric].percent else ''}) · {DATASET_TITLES.get(dataset, dataset)}"
        md.append(f"## {title}\n\n" + table_to_markdown(*accuracy_rows(table, dataset, bold=best_per_length(table, metric), detail=True))
                  + "\n" + _notes(table))
        tex.append(table_to_latex(*accuracy_rows(table, dataset, detail=True), title))
        csv_parts.append(table_to_csv(header, body, extra=[dataset]))
    (out / "accuracy.md").write_text("\n".join(md))
    (out / "accuracy.tex").write_text("\n".join(tex))
    (out / "accuracy.csv").write_text(_join_csv(csv_parts))
    sections += md

    latency = latency_table(rows, timings)
    speed = speedups(latency)
    lat_header = ["Dataset", "Backbone", "Method", "Concurrency", "Length", "s/sample (amortized)", "steps", "samples"]
    lat_body = [[e["dataset"], e["backbone"], e["row"], str(e["concurrency"]), str(e["length"]), f"{e['amortized_s']:.3f}",
                 f"{e['steps']:.2f}", str(e["samples"])] for e in latency]
    lat_md = "## Latency (amortized seconds per sample) and sequential steps\n\n" + table_to_markdown(lat_header, lat_body)
    if speed:
        sp_header = ["Dataset", "Backbone", "Baseline", "Concurrency", "Length", "speedup (baseline/ParSer)", "steps ratio", "paper speedup"]
        sp_body = [[s["dataset"], s["backbone"], s["baseline"], str(s["concurrency"]), str(s["length"]), f"{s['speedup']:.2f}x",
                    f"{s['steps_ratio']:.2f}x", f"{s['paper_speedup']:.1f}x" if s["paper_speedup"] else "–"] for s in speed]
        lat_md += "\n" + table_to_markdown(sp_header, sp_body)
    over_floor = floor_table(latency, read_floors(paths))
    if over_floor:
        fl_header = ["Dataset", "Backbone", "Method", "Concurrency", "Length", "floor s (read once)", "x floor"]
        fl_body = [[e["dataset"], e["backbone"], e["row"], str(e["concurrency"]), str(e["length"]), f"{e['floor_s']:.3f}",
                    f"{e['x_floor']:.2f}x"] for e in over_floor]
        lat_md += "\n## Time over the floor (the document read once, same backend, same run)\n\n" + \
            table_to_markdown(fl_header, fl_body)
    (out / "latency.md").write_text(lat_md)
    (out / "latency.csv").write_text(table_to_csv(lat_header, lat_body))
    sections.append(lat_md)

    tokens = token_table(rows)
    tok_header = ["Dataset", "Backbone", "Method", "Length", "lead", "subagents", "total"]
    tok_body = [[t["dataset"], t["backbone"], t["row"], str(t["length"]), f"{t['lead']:.1f}", f"{t['subagents']:.1f}",
                 f"{t['total']:.1f}"] for t in tokens]
    tok_md = "## Output tokens per sample (mean)\n\n" + table_to_markdown(tok_header, tok_body)
    (out / "tokens.md").write_text(tok_md)
    (out / "tokens.csv").write_text(table_to_csv(tok_header, tok_body))
    sections.append(tok_md)

    costs = cost_table(rows, metric)
    cost_header = ["Dataset", "Backbone", "Method", "Length", f"{metric}{' %' if BY_NAME[metric].percent else ''}", "steps",
                   "sub-calls", "planner calls", "stopped early", "s/sample (mean)", "samples"]
    cost_body = [[c["dataset"], c["backbone"], c["row"], str(c["length"]), _fmt(c["accuracy"]), f"{c['steps']:.2f}",
                  *("–" if c[k] is None else f"{c[k]:.{p}f}" for k, p in (("sub_calls", 1), ("plans", 1), ("stopped_early", 2))),
                  f"{c['wall_s']:.3f}", str(c["samples"])] for c in costs]
    cost_md = ("## Accuracy beside its cost: steps, sub-calls and seconds per sample (means)\n\n"
               + table_to_markdown(cost_header, cost_body))
    (out / "cost.md").write_text(cost_md)
    (out / "cost.csv").write_text(table_to_csv(cost_header, cost_body))
    sections.append(cost_md)

    prompts = lead_prompt_table(rows)
    if prompts:
        pr_header = ["Dataset", "Backbone", "Method", "Length", "turns", "prompt tokens by turn (mean)", "max"]
        pr_body = [[p["dataset"], p["backbone"], p["row"], str(p["length"]), f"{p['turns']:.1f}",
                    " → ".join(f"{x:.0f}" for x in p["by_turn"]), str(p["max"])] for p in prompts]
        pr_md = "## Lead prompt tokens per turn\n\n" + table_to_markdown(pr_header, pr_body)
        (out / "lead_prompt.md").write_text(pr_md)
        sections.append(pr_md)

    controlled = controlled_table(rows)
    if controlled:
        c_md, c_csv = [], []
        for dataset, table in controlled.items():
            header = ["Backbone", "Method", *table["conditions"], "Spread (max − min)"]
            body = [[b, m, *(_fmt(v.get(c)) for c in table["conditions"]), _fmt(table["spread"][(b, m)])]
                    for (b, m), v in table["lines"].items()]
            c_md.append(f"## Controlled · {table['analysis']} · {dataset}\n\n" + table_to_markdown(header, body))
            c_csv.append(table_to_csv(header, body, extra=[dataset]))
        s_header, s_body = sensitivity_rows(controlled)
        c_md.append("## Sensitivity: spread of Sub_EM (max − min over conditions, points; lower = steadier)\n\n"
                    + table_to_markdown(s_header, s_body))
        (out / "controlled.md").write_text("\n".join(c_md))
        (out / "controlled.csv").write_text(_join_csv(c_csv))
        (out / "sensitivity.md").write_text(c_md[-1])
        (out / "sensitivity.csv").write_text(table_to_csv(s_header, s_body))
        sections += c_md
    reading = sorted(evidence_reading(rows), key=lambda e: (e["dataset"], e["backbone"], e["row"], str(e["condition"])))
    if reading:
        r_header = ["Dataset", "Backbone", "Method", "Condition", "chunks", "first evidence read at", "last evidence read at",
                    "chunks from first to last evidence", "read in reasoning order", "samples"]
        r_body = [[e["dataset"], e["backbone"], e["row"], str(e["condition"]), f"{e['chunks']:.1f}", f"{e['first']:.2f}",
                   f"{e['last']:.2f}", f"{e['gap']:.2f}", f"{e['in_order']:.2f}", str(e["samples"])] for e in reading]
        r_md = ("## When the sequential readers read the evidence (fraction of the pass: 0 = first chunk read, 1 = last)\n\n"
                + table_to_markdown(r_header, r_body))
        (out / "reading.md").write_text(r_md)
        (out / "reading.csv").write_text(table_to_csv(r_header, r_body))
        sections.append(r_md)

    rl = learning.rl_tables(rows)
    if rl:
        rl_md = learning.rl_markdown(rl)
        (out / "rl.md").write_text(rl_md)
        sections.insert(1, rl_md)

    fig_dir = out / "figures"
    figures = (plot_accuracy(tables, fig_dir) + plot_controlled(controlled, fig_dir)
               + plot_latency(latency, speed, fig_dir, over_floor))
    steps = learning.read_train_log(train_log) if train_log else None
    if steps:
        figures.append(learning.plot_training_curve(steps, fig_dir / "training_curve.png"))
    sections.append("## Figures\n\n" + "\n".join(f"- ![{p.stem}](figures/{p.name}) `{p}`" for p in figures) + "\n")

    pages = []
    if viewer:
        from eval.viewer import write_viewer

        for d in run_dirs:
            pages.append(write_viewer(d, out / "viewer" / f"{_slug(d)}.html"))
        sections.append("## Trajectory viewer\n\n" + "\n".join(f"- `{p}`" for p in pages) + "\n")
    (out / "report.md").write_text("\n".join(sections))
    return {"run_dirs": run_dirs, "tables": tables, "reading": reading, "latency": latency, "speedups": speed,
            "over_floor": over_floor,
            "tokens": tokens, "costs": costs, "controlled": controlled, "figures": figures, "viewer": pages, "report": out / "report.md",
            "rl": rl, "rows": rows, "train_steps": steps}


class ReportError(ValueError):
    """What `parser report` cannot do, said in one line (exit 2)."""


def prepare_out(out: str | Path) -> Path:
    """`--out`, created if need be and writable, before anything is read into it."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ReportError(f"--out {out}: cannot create it ({error.strerror or error})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ReportError(f"--out {out}: not writable")
    return out


def _join_csv(parts: Sequence[str]) -> str:
    """One CSV: the first part's header, then the bodies (parts with a different header keep theirs)."""
    lines: list[str] = []
    header = None
    for part in parts:
        first, *rest = part.splitlines()
        if first != header:
            lines.append(first)
            header = first
        lines += rest
    return "\n".join(lines) + "\n"


def _slug(path: Path) -> str:
    """A file name for a run directory: its last three path parts, safe characters only."""
    parts = [p for p in path.resolve().parts[-3:] if p not in ("/", "")]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(parts)) or "run"


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="eval run directories (or folders containing them)")
    ap.add_argument("--out", default="reports/latest", help="where tables, figures and viewer pages go")
    ap.add_argument("--paper", action="store_true", help="print the paper's published numbers beside ours")
    ap.add_argument("--no-viewer", action="store_true", help="skip the per-run trajectory viewer pages")
    ap.add_argument("--metric", default=PRIMARY, choices=list(BY_NAME),
                    help=f"the accuracy tables' metric (default {PRIMARY}; sub_em_compat: MemAgent's and ReMemR1's scorer)")
    ap.add_argument("--train-log", help="verl's file-logger JSONL of the training run: plot its curve")
    ap.add_argument("--summary", help="write the learning run's summary.json here (needs --train-log and "
                                      "rows with variant w/o RL and w/ RL)")
    ap.add_argument("--require-learning", action="store_true",
                    help="exit 1 unless the summary shows learning (eval.learning's thresholds)")
    args = ap.parse_args(argv)
    if (args.summary or args.require_learning) and not args.train_log:
        ap.error("--summary and --require-learning need --train-log")
    try:
        result = build_report(args.paths, args.out, with_paper=args.paper, viewer=not args.no_viewer,
                              train_log=args.train_log, metric=args.metric)
    except (ValueError, OSError) as error:  # a missing or empty directory, a duplicate run, a bad row or --out
        print("parser report: error: " + " ".join(str(error).split()), file=sys.stderr)
        raise SystemExit(2) from None
    print(Path(result["report"]).read_text())
    if args.summary or args.require_learning:
        figures = learning.summary(result["rows"], result["train_steps"])
        if args.summary:
            Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
            Path(args.summary).write_text(json.dumps(figures, indent=2) + "\n")
        print(json.dumps(figures, indent=2))
        problems = learning.learning_failures(figures)
        print("learning: " + ("yes" if not problems else "NO: " + "; ".join(problems)))
        if args.require_learning and problems:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
