"""RULER out-of-distribution eval (paper Appendix B.2): every task x length, scored as RULER does, as a heat map.

Why a separate entry point: RULER is ten datasets (one per task), each a set of
`eval_{task}_{length}.json` files, and its non-QA tasks are scored by RULER's
`string_match_all` (the fraction of gold strings found, case-insensitively, in the answer),
not by Sub_EM. This module runs the ordinary eval (`eval.run.evaluate`, the same engine,
methods, store and resume logic) once per task into ``{out_dir}/{task}/``, then rescores the
result rows and draws the task x length heat map.

Scoring, as MemAgent's ``taskutils/memory_eval/ruler_general.py``: non-QA tasks get
`string_match_all`; `qa_*` tasks get Sub_EM (`parser.text.reward.sub_em`) against all golds, or
against the first gold only with ``ruler.qa_golds=first`` (what that script does). A missing
prediction scores 0. The eval rows keep their ordinary `sub_em` too; the heat map uses this score.

Each task is its own `evaluate` call (own results and resume state), all sharing one built
method and its models, so an in-process engine starts once.

    parser ruler                                   # configs/eval/ruler.yaml: generate missing files, eval, report
    parser ruler --config-name ruler_tiny_cpu      # CPU smoke test: tiny models, two small lengths
    parser ruler report outputs/eval/ruler/Qwen3.5-4B/ParSer [--out DIR]   # heat map + table from results
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import math
import sys
from operator import attrgetter
from pathlib import Path
from typing import Any, Iterable, Sequence

from data_prep.ruler_tasks import TASKS, get_task, load_ruler_file, ruler_file
from parser.records.result import ResultRow
from parser.text.reward import sub_em

DATASET_PREFIX = "ruler_"  # eval rows carry dataset = "ruler_{task}"
TITLES = {"niah_single_1": "S-NIAH-1", "niah_single_2": "S-NIAH-2", "niah_single_3": "S-NIAH-3",
          "niah_multikey_1": "MK-NIAH-1", "niah_multikey_2": "MK-NIAH-2", "niah_multikey_3": "MK-NIAH-3",
          "niah_multivalue": "MV-NIAH", "niah_multiquery": "MQ-NIAH", "vt": "VT", "fwe": "FWE", "qa_1": "QA-1"}


# ----------------------------------------------------------------------------- scoring

def string_match_all(prediction: str | None, golds: Sequence[str]) -> float:
    """RULER's metric: the fraction of gold strings that occur in the prediction, ignoring case."""
    if not prediction or not golds:
        return 0.0
    pred = prediction.lower()
    return sum(1.0 for g in golds if g.lower() in pred) / len(golds)


def ruler_score(task: str, prediction: str | None, golds: Sequence[str], qa_golds: str = "all") -> float:
    """One sample's score in [0, 1]: Sub_EM for qa tasks, string_match_all otherwise."""
    if get_task(task).is_qa:
        if qa_golds not in ("all", "first"):
            raise ValueError(f"qa_golds must be 'all' or 'first', got {qa_golds!r}")
        return sub_em(prediction, list(golds) if qa_golds == "all" else list(golds)[:1])
    return string_match_all(prediction, golds)


def task_of(dataset: str) -> str:
    task = dataset[len(DATASET_PREFIX):] if dataset.startswith(DATASET_PREFIX) else dataset
    get_task(task)  # unknown names fail here, naming the known ones
    return task


# ----------------------------------------------------------------------------- report

@dataclasses.dataclass(frozen=True)
class Scored:
    """A RULER result row with its task and its score in [0, 1] (`ruler_score`)."""

    row: ResultRow
    task: str
    ruler_score: float

    @property
    def run(self) -> int:  # what `run_averaged` groups by
        return self.row.run


def score_rows(rows: Iterable[ResultRow], qa_golds: str = "all") -> list[Scored]:
    """Result rows of RULER datasets, each scored (others are skipped)."""
    out = []
    for row in rows:
        if not row.dataset.startswith(DATASET_PREFIX):
            continue
        task = task_of(row.dataset)
        out.append(Scored(row, task, ruler_score(task, row.prediction, row.answers, qa_golds)))
    return out


def score_table(scored: Sequence[Scored]) -> dict[str, Any]:
    """(backbone, row) -> task -> length -> % (mean over samples within a run, then over runs)."""
    from eval.report import run_averaged

    groups: dict[tuple[str, str, str, int], list[Scored]] = collections.defaultdict(list)
    for s in scored:
        groups[(s.row.backbone, s.row.row, s.task, s.row.length)].append(s)
    table: dict[str, Any] = {}
    for (backbone, label, task, length), rs in sorted(groups.items()):
        cell = {"value": 100 * run_averaged(rs, attrgetter("ruler_score")), "samples": len(rs), "runs": len({s.run for s in rs})}
        table.setdefault(f"{backbone} / {label}", {}).setdefault(task, {})[length] = cell
    return table


def _ordered_tasks(present: Iterable[str]) -> list[str]:
    present = set(present)
    return [t for t in TASKS if t in present]


def _length_label(length: int) -> str:
    return f"{length // 1024}K" if length % 1024 == 0 else str(length)


def table_markdown(table: dict[str, Any]) -> str:
    from eval.report import table_to_markdown

    parts = []
    for panel, by_task in table.items():
        lengths = sorted({L for cells in by_task.values() for L in cells})
        body = []
        for task in _ordered_tasks(by_task):
            values = [by_task[task].get(L, {}).get("value") for L in lengths]
            present = [v for v in values if v is not None]
            body.append([TITLES.get(task, task)] + ["–" if v is None else f"{v:.1f}" for v in values]
                        + [f"{sum(present) / len(present):.1f}" if present else "–"])
        columns = [[by_task[t][L]["value"] for t in by_task if L in by_task[t]] for L in lengths]
        body.append(["Avg."] + [f"{sum(c) / len(c):.1f}" for c in columns] + [""])
        parts.append(f"### {panel}\n\nRULER score (%, string_match_all; Sub_EM for QA)\n\n"
                     + table_to_markdown(["Task"] + [_length_label(L) for L in lengths] + ["Avg."], body))
    return "\n\n".join(parts) + "\n"


def plot_heatmap(table: dict[str, Any], path: Path) -> Path:
    """One panel per (backbone, row): tasks down, lengths across, each cell the score in %."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(table.items())
    n_lengths = max(len({L for cells in by_task.values() for L in cells}) for _, by_task in panels)
    n_tasks = max(len(by_task) for _, by_task in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=((1.8 + 0.8 * n_lengths) * len(panels), 1.0 + 0.45 * n_tasks),
                             squeeze=False)
    image = None
    for ax, (panel, by_task) in zip(axes[0], panels, strict=True):
        tasks = _ordered_tasks(by_task)
        lengths = sorted({L for cells in by_task.values() for L in cells})
        grid = [[by_task[t].get(L, {}).get("value", math.nan) for L in lengths] for t in tasks]
        image = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(lengths)), [_length_label(L) for L in lengths])
        ax.set_yticks(range(len(tasks)), [TITLES.get(t, t) for t in tasks])
        ax.set_xlabel("context length (tokens)")
        ax.set_title(panel, fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=list(axes[0]), label="score (%)", shrink=0.8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def build_ruler_report(paths: Sequence[str | Path], out: str | Path, qa_golds: str = "all") -> dict[str, Any]:
    """Read every results.jsonl under `paths`; write ruler_heatmap.png, ruler_table.md, ruler_scores.json."""
    from eval.report import find_run_dirs, load

    rows, _ = load(find_run_dirs(paths))
    scored = score_rows(rows, qa_golds)
    if not scored:
        raise ValueError(f"{', '.join(map(str, paths))}: no RULER rows (dataset 'ruler_<task>') in any results.jsonl")
    table = score_table(scored)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ruler_table.md").write_text(table_markdown(table))
    (out / "ruler_scores.json").write_text(json.dumps({"qa_golds": qa_golds, "table": table}, indent=2))
    heatmap = plot_heatmap(table, out / "ruler_heatmap.png")
    return {"table": table, "heatmap": heatmap, "markdown": out / "ruler_table.md", "rows": len(scored)}


# ----------------------------------------------------------------------------- eval

def task_config(cfg: Any, task: str) -> Any:
    """The ordinary eval config with `dataset` pointing at one task's files and its own out_dir."""
    from omegaconf import OmegaConf

    rc = cfg.ruler
    data_dir = Path(str(rc.data_dir))
    dataset = {"name": f"{DATASET_PREFIX}{task}", "source": "files", "lengths": [int(L) for L in rc.lengths],
               "path": str(data_dir / f"eval_{task}_{{length}}.json")}
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("ruler")
    plain.update(dataset=dataset, out_dir=str(Path(str(cfg.out_dir)) / task))
    return OmegaConf.create(plain)


def prepare_data(cfg: Any) -> None:
    """Generate the missing files (if asked), then validate every file before any model runs."""
    from omegaconf import OmegaConf

    rc = cfg.ruler
    if rc.generate_missing:
        from data_prep.ruler import build_files

        gen = OmegaConf.to_container(rc.generate, resolve=True)
        gen.update(tasks=list(rc.tasks), lengths=list(rc.lengths), out_dir=str(rc.data_dir))
        build_files(gen)
    for task in rc.tasks:
        for length in rc.lengths:
            load_ruler_file(ruler_file(rc.data_dir, task, length))


async def evaluate_ruler(cfg: Any) -> int:
    from eval.run import build_eval_method, evaluate

    prepare_data(cfg)
    status = 0
    method = build_eval_method(task_config(cfg, str(cfg.ruler.tasks[0])))  # once for all tasks
    try:
        for task in cfg.ruler.tasks:
            print(f"[ruler] {task}: {', '.join(map(str, cfg.ruler.lengths))} tokens -> {Path(str(cfg.out_dir)) / task}")
            status |= await evaluate(task_config(cfg, str(task)), method)
    finally:
        await method.aclose()
    report = build_ruler_report([cfg.out_dir], Path(str(cfg.out_dir)) / "report", qa_golds=str(cfg.ruler.qa_golds))
    print(f"[ruler] heat map {report['heatmap']}\n{report['markdown'].read_text()}")
    return status


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        import argparse

        ap = argparse.ArgumentParser(prog="parser ruler report", description="RULER heat map + table from results")
        ap.add_argument("paths", nargs="+", help="eval run directories (or folders holding them)")
        ap.add_argument("--out", default=None, help="output folder (default: <first path>/report)")
        ap.add_argument("--qa-golds", choices=("all", "first"), default="all")
        args = ap.parse_args(argv[1:])
        report = build_ruler_report(args.paths, args.out or Path(args.paths[0]) / "report", qa_golds=args.qa_golds)
        print(f"[ruler] {report['rows']} rows -> {report['heatmap']}\n{report['markdown'].read_text()}")
        return
    import hydra

    from parser.base.resources import config_dir

    @hydra.main(config_path=str(config_dir("eval")), config_name="ruler", version_base="1.3")
    def run(cfg: Any) -> None:
        try:
            sys.exit(asyncio.run(evaluate_ruler(cfg)))
        except (RunDirLocked, InputsChanged, ManifestDamaged) as error:
            print(f"eval.ruler: error: {error}", file=sys.stderr)
            sys.exit(2)

    from eval.inputs import InputsChanged
    from eval.provenance import ManifestDamaged
    from eval.run import with_search_path
    from parser.base import hydra_help
    from parser.base.settings import precheck
    from eval.store import RunDirLocked  # shared presets: configs/backend, configs/episode, configs/method

    hydra_help.register()
    sys.argv = [sys.argv[0], *with_search_path(argv)]
    precheck(config_dir("eval"), "ruler", sys.argv[1:], prog="eval.ruler")  # a typo or a bad value: one line
    run()


if __name__ == "__main__":
    main()
