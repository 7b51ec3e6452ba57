"""The order-sensitivity study: ParSer against sequential readers in several chunk orders, on the controlled sets.

Paper §4.1 shows that sequential memory agents swing with where the evidence sits (position,
order, distance) while ParSer stays flat. Gupta et al. keep the sequential reader and fix its
order instead (Chow–Liu tree, CL-order). This entry point puts both answers side by side:
ParSer, MemAgent (document, CL-order) and Chain-of-Agents (document, dense, CL-order) on the
same controlled sets, with each method's spread (max − min accuracy over a set's conditions).

Each (method, set) cell is one ordinary eval (`eval.run.evaluate`: the same engine, store and
resume) composed exactly as `parser eval method=<m> dataset=<d>` would be, into its own
folder under `study.root`; cells on the same models share one set of built models, and an entry
whose `overrides` pick other models (`backend@models=...`: a peer's own checkpoint) gets its
own, built when its first cell runs. Then `eval.report`
writes the tables (`controlled.md`: accuracy per condition and the spread; `sensitivity.md`:
the spreads alone; `cost.md`: accuracy beside steps, sub-calls and seconds) and figures
(`figures/controlled_sensitivity.png`) to `{study.root}/report`. The same runner runs the peers
grid (configs/eval/peers.yaml: ParSer, MemAgent, RLM on ParSer's models and as its authors run it,
InfMem-4B, on the paper's HotpotQA lengths):

    parser order-study --config-name peers_tiny_cpu         # the peers grid on tiny CPU models

    parser order-study                                     # configs/eval/order_study.yaml: paper models, HotpotQA/2Wiki sets
    parser order-study --config-name order_study_tiny_cpu  # CPU smoke: tiny random models, synthetic world
    parser order-study --config-name order_study_cpu       # SmolLM2-135M on CPU, synthetic world
    parser report outputs/order_study/tiny-qwen3.5 --out reports/order_study_tiny

Re-running the same command resumes every cell. A cell another process is evaluating (its
folder locked) is reported and skipped, the study goes on, and it exits 1. Settings that apply to one method or one set go
in that entry's `overrides` (Hydra override strings), not on the command line, where they would
reach every cell.
"""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf


def cell_overrides(method: Any, dataset: Any) -> list[str]:
    """The eval.run overrides of one (method entry, dataset entry) of `study`."""
    overrides = [f"method={method['config']}", f"dataset={dataset['config']}"]
    if method.get("order"):
        overrides.append(f"method.order={method['order']}")
    return overrides + list(method.get("overrides") or []) + list(dataset.get("overrides") or [])


def _entries(section: Any, what: str) -> list[dict[str, Any]]:
    entries = [{"config": e} if isinstance(e, str) else dict(e) for e in OmegaConf.to_container(section, resolve=True)]
    for i, entry in enumerate(entries):
        if "config" not in entry:
            raise ValueError(f"study.{what}[{i}]: needs `config` (a file of configs/{'method' if what == 'methods' else 'eval/dataset'}/)")
    if not entries:
        raise ValueError(f"study.{what}: empty")
    return entries


async def run_study(cfg: DictConfig, compose_cell: Any) -> int:
    """Every cell of `cfg.study`, then the report; `compose_cell(overrides)` gives a cell's eval config."""
    from eval.report import build_report
    from eval.run import build_eval_method, check_settings, evaluate
    from eval.store import RunDirLocked
    from parser.serving.backends.models import build_models

    methods, datasets = _entries(cfg.study.methods, "methods"), _entries(cfg.study.datasets, "datasets")
    cells = [(i, compose_cell(cell_overrides(m, d))) for i, m in enumerate(methods) for d in datasets]
    models_cfgs = [OmegaConf.to_container(cell.models, resolve=True) for _, cell in cells]
    for _, cell in cells:  # before any model is built: a setting no cell can honour stops the study at once
        check_settings(cell)
    labels = [(cell.report.backbone, cell.report.row) for _, cell in cells[:: len(datasets)]]
    if len(set(labels)) != len(labels):
        raise ValueError(f"study.methods: two entries give the same table row ({labels}); give each its own order or label")
    folders = [str(cell.out_dir) for _, cell in cells]
    if len(set(folders)) != len(folders):  # a second entry would resume, or be refused by, the first one's rows
        twice = sorted({f for f in folders if folders.count(f) > 1})
        raise ValueError(f"study: two cells write to the same folder ({', '.join(twice)}); give the entry its own "
                         "method config (its `name` names the folder)")
    for index in range(len(methods)):  # an entry's models are one set over its datasets: it is built once
        mine = models_cfgs[index * len(datasets): (index + 1) * len(datasets)]
        if any(m != mine[0] for m in mine):
            raise ValueError(f"study: study.methods[{index}] runs on other models on some datasets; "
                             "set models in the entry's overrides, not in a dataset's")
    shared: list[tuple[dict[str, Any], Any]] = []  # (models config, built models): one per distinct config

    def models_for(config: dict[str, Any]) -> Any:
        for known, models in shared:
            if known == config:
                return models
        shared.append((config, build_models(config)))
        return shared[-1][1]

    built: dict[int, Any] = {}
    status = 0
    try:
        for (index, cell), models_cfg in zip(cells, models_cfgs, strict=True):
            print(f"[study] {cell.report.row} on {cell.dataset.name} -> {cell.out_dir}")
            if index not in built:
                built[index] = build_eval_method(cell, models_for(models_cfg))
            try:
                status |= await evaluate(cell, built[index])
            except RunDirLocked as error:  # another process evaluates this cell: record it, run the others
                print(f"[study] {cell.report.row} on {cell.dataset.name}: skipped, {error}", flush=True)
                status |= 1
    finally:
        for method in built.values():
            await method.aclose()  # the models are shared; closing them twice is safe
        for _, models in shared:
            await models.aclose()
    report = build_report([cfg.study.root], Path(str(cfg.study.root)) / "report", viewer=bool(cfg.study.viewer))
    print(f"[study] report {report['report']}\n")
    summary = Path(report["report"]).parent / ("sensitivity.md" if report["controlled"] else "cost.md")
    print(summary.read_text())
    return status


def main(argv: Sequence[str] | None = None) -> None:
    import hydra
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig

    from eval.run import CONFIGS, BadSetting, with_search_path
    from parser.base import hydra_help
    from parser.base.settings import precheck

    @hydra.main(config_path=str(CONFIGS / "eval"), config_name="order_study", version_base="1.3")
    def run(cfg: DictConfig) -> None:
        hydra_cfg = HydraConfig.get()
        base = [*hydra_cfg.overrides.task, f"hydra.searchpath=[file://{CONFIGS}]"]

        def compose_cell(overrides: list[str]) -> DictConfig:
            return compose(hydra_cfg.job.config_name, overrides=[*base, *overrides])

        try:
            sys.exit(asyncio.run(run_study(cfg, compose_cell)))
        except BadSetting as error:
            print(f"eval.order_study: error: {error}", file=sys.stderr)
            sys.exit(2)

    hydra_help.register()
    sys.argv = [sys.argv[0], *with_search_path(list(sys.argv[1:] if argv is None else argv))]
    precheck(CONFIGS / "eval", "order_study", sys.argv[1:], prog="eval.order_study")  # a typo or a bad value: one line
    run()


if __name__ == "__main__":
    main()
