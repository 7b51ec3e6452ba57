"""Project measured method behaviour to the paper's lengths on the paper's hardware.

Why: the CPU latency bench (scripts/bench_latency.py) runs a 135M model on two cores, where every
method is compute-bound and the wall-clock ratio is a ratio of compute. The paper's 11.2x at 896K
is a ratio of critical paths on GPUs. This module takes what the bench counted per sample —
ParSer's query rounds and queries per round, how full each call's output budget was — and runs
the planner's simulation (`simulate_parser`, `simulate_memagent`) with the rates fitted to the
paper's Table 2 (`parser plan table2`: an H100 for the subagents and for MemAgent, an RTX 3090
for the lead, Qwen3.5-4B) at 7K..896K tokens, beside the paper's own figures and beside the same
simulation on the paper's workload (configs/plan/paper_workload/table2.yaml), so a difference
from Table 2 is traceable to the count that differs.

What carries over from the measurement: the structure — ParSer's query rounds and queries per
round as counted (the critical path), each method's chunk size from its paper preset — in the
main projection, with the paper workload's output sizes (findings, lead turns, a ~1K-token memory
per chunk). A second projection also carries the outputs over, as the fraction of each role's
per-call budget the small model used (`Shape.*_fill`) applied to the paper preset's budget (a
135M model that fills 64 of 64 memory tokens projects to 1,024 of 1,024): budgets at CPU scale
are not the paper's, so this one shows how sensitive the ratio is to output lengths rather than a
forecast. Prompt frames and the lead's prompt are the paper's. Sequential methods other than
MemAgent (ReMemR1, CoA) run the same sequential simulation with their own chunk size; the paper
did not time them.

    rows = project({"ParSer": parser_shape, "MemAgent": memagent_shape}, paper_budgets)
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import yaml

from parser.base.resources import config_file
from parser.plan import table2
from parser.plan.planner import load_spec
from parser.plan.rates import Rates
from parser.plan.simulate import Cluster, Workload, simulate_memagent, simulate_parser

RATES = "configs/plan/rates/h100_qwen35_4b.yaml"
LEAD_RATES = "configs/plan/rates/rtx3090_qwen35_4b_lead.yaml"
PAPER_WORKLOAD = "configs/plan/paper_workload/table2.yaml"
MODEL = "configs/plan/model/qwen35_4b.yaml"
PAPER_TIMED = {"ParSer": True, "MemAgent": False}  # Table 2's rows (parallel or not); the paper timed no other


@dataclasses.dataclass(frozen=True)
class Shape:
    """One method's behaviour per sample, as the bench counted it at one length."""

    parallel: bool  # ParSer (scatter rounds) or a sequential reader (one call per chunk, then an answer)
    rounds: float = 0.0  # ParSer: lead turns that scattered a query
    queries_per_round: float = 1.0
    lead_fill: float = 0.0  # ParSer: lead tokens per lead call / the lead's per-turn budget
    subagent_fill: float = 0.0  # ParSer: tokens per subagent call / the subagent budget
    update_fill: float = 0.0  # sequential: tokens per call / the update (memory, summary) budget

    @classmethod
    def from_counts(cls, parallel: bool, *, calls: Mapping[str, float], decoded: Mapping[str, float],
                    budgets: Mapping[str, int], critical_path: float, chunks: float) -> "Shape":
        """From one sample's mean counts: model calls and tokens decoded per role, the CPU run's
        per-call budgets, the critical-path calls (ParSer: lead, round, lead, ..., lead = 2 x rounds + 1)
        and the chunks read."""
        def fill(role: str) -> float:
            return decoded.get(role, 0.0) / calls[role] / budgets[role] if calls.get(role) else 0.0

        if not parallel:
            return cls(False, update_fill=min(1.0, fill("lead")))
        rounds = max(0.0, (critical_path - 1) / 2)
        queries = calls.get("subagent", 0.0) / (rounds * chunks) if rounds and chunks else 1.0
        return cls(True, rounds=rounds, queries_per_round=max(1.0, queries), lead_fill=min(1.0, fill("lead")),
                   subagent_fill=min(1.0, fill("subagent")))


@dataclasses.dataclass(frozen=True)
class PaperBudgets:
    """A method's per-call budgets and chunk size in its paper preset (configs/method/<name>.yaml)."""

    chunk_size: int
    update_tokens: int = 0  # sequential: max_memory_tokens / max_summary_tokens
    lead_tokens: int = 0  # ParSer: max_tokens_per_turn
    subagent_tokens: int = 0  # ParSer: subagent_max_tokens


def _yaml(path: str) -> dict[str, Any]:
    return yaml.safe_load(config_file(path).read_text(encoding="utf-8"))


def paper_cluster() -> Cluster:
    """Table 2's machines: subagents and MemAgent on one H100, the lead on one RTX 3090 (the fitted rates)."""
    spec = load_spec(_yaml(MODEL))
    h100, lead = Rates.load(config_file(RATES)), Rates.load(config_file(LEAD_RATES))
    return Cluster(subagent_rates=h100, subagent_workers=1, lead_rates=lead, memagent_rates=h100, spec=spec)


def workload(doc_tokens: int, shape: Shape | None, budgets: PaperBudgets | None, fills: bool = False) -> Workload:
    """The paper's Table 2 workload at `doc_tokens` with `shape`'s structure in place of the paper's
    (None: the paper's own): ParSer's rounds and queries per round, each method's chunk size. With
    `fills`, also each call's output as the measured fill of the paper preset's budget; without,
    the paper workload's output sizes (its findings, lead turns, and MemAgent's ~1K memory for every
    sequential reader)."""
    base = table2.workload(doc_tokens, _yaml(PAPER_WORKLOAD))
    if shape is None or budgets is None:
        return base
    if shape.parallel:
        wl = dataclasses.replace(base, chunk_size=budgets.chunk_size, num_chunks=None,
                                 rounds=max(1, round(shape.rounds)), queries_per_round=shape.queries_per_round)
        if fills:
            wl = dataclasses.replace(wl, subagent_output_tokens=(max(1, round(shape.subagent_fill * budgets.subagent_tokens)),),
                                     lead_output_tokens=max(1, round(shape.lead_fill * budgets.lead_tokens)))
        return wl
    wl = dataclasses.replace(base, memagent_chunk_size=budgets.chunk_size)
    return dataclasses.replace(wl, memory_tokens=max(1, round(shape.update_fill * budgets.update_tokens))) if fills else wl


def seconds(doc_tokens: int, shape: Shape | None, budgets: PaperBudgets | None, parallel: bool,
            cluster: Cluster | None = None, fills: bool = False) -> float:
    """Projected amortized seconds per sample at concurrency 1 (Table 2's metric)."""
    cluster = cluster or paper_cluster()
    wl = workload(doc_tokens, shape, budgets, fills)
    return (simulate_parser if parallel else simulate_memagent)(wl, cluster).amortized_s


def project(shapes: Mapping[str, Shape], budgets: Mapping[str, PaperBudgets], reference: str = "ParSer",
            lengths: tuple[int, ...] = table2.LENGTHS, timed: Mapping[str, bool] = PAPER_TIMED) -> list[dict[str, Any]]:
    """Per paper length and method: projected seconds from the measured structure (`seconds`) and
    with the measured output fills too (`seconds_fills`), each over the reference's (`ratio`,
    `ratio_fills`), and for the methods the paper timed (`timed`: row -> parallel) the same
    simulation on the paper's workload and the paper's figures."""
    cluster = paper_cluster()
    rows = []
    for n in lengths:
        paper_parser = seconds(n, None, None, True, cluster)
        paper_sequential = seconds(n, None, None, False, cluster)
        ours = {name: seconds(n, shape, budgets[name], shape.parallel, cluster) for name, shape in shapes.items()}
        filled = {name: seconds(n, shape, budgets[name], shape.parallel, cluster, fills=True)
                  for name, shape in shapes.items()}
        index = table2.LENGTHS.index(n) if n in table2.LENGTHS else None
        for name, value in ours.items():
            parallel = timed.get(name)
            rows.append({"doc_tokens": n, "method": name, "seconds": value, "seconds_fills": filled[name],
                         "ratio": value / ours[reference] if reference in ours else None,
                         "ratio_fills": filled[name] / filled[reference] if reference in filled else None,
                         "paper_workload_s": None if parallel is None else paper_parser if parallel else paper_sequential,
                         "paper_s": None if parallel is None else (table2.PARSER_S if parallel else table2.MEMAGENT_S).get(n),
                         "paper_ratio": table2.RATIO[index] if index is not None and parallel is False else None})
    return rows
