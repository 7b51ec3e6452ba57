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

The peers run the planner's own simulations of them (`simulate_infmem`, `simulate_rlm`; the
paper timed neither, so they have no reference column). InfMem carries over its chunk size and
the fraction of its chunks it planned over before its early stop (`read_fraction`); RLM carries
over its root calls (`turns`) and the root turns whose code ran sub-calls (`rounds`: each, in the
simulated strategy, a batched round over the document and one combining call), while the slice
size of its sub-calls stays rlms' suggested ~100K characters (a CPU document is shorter than one).

    rows = project({"ParSer": parser_shape, "MemAgent": memagent_shape}, paper_budgets)
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import yaml

from parser.base.resources import config_file
from parser.plan import table2
from parser.plan.planner import load_spec
from parser.plan.rates import Rates
from parser.plan.simulate import Cluster, Result, Workload, simulate_infmem, simulate_memagent, simulate_parser, simulate_rlm

RATES = "configs/plan/rates/h100_qwen35_4b.yaml"
LEAD_RATES = "configs/plan/rates/rtx3090_qwen35_4b_lead.yaml"
PAPER_WORKLOAD = "configs/plan/paper_workload/table2.yaml"
MODEL = "configs/plan/model/qwen35_4b.yaml"
# a shape's kind -> the simulation that projects it
SIMULATIONS: dict[str, Callable[[Workload, Cluster], Result]] = {
    "scatter": simulate_parser, "sequential": simulate_memagent, "infmem": simulate_infmem, "rlm": simulate_rlm}
PAPER_TIMED = {"ParSer": "scatter", "MemAgent": "sequential"}  # Table 2's rows (their kind); the paper timed no other


@dataclasses.dataclass(frozen=True)
class Shape:
    """One method's behaviour per sample, as the bench counted it at one length."""

    kind: str  # a key of SIMULATIONS: scatter (ParSer's rounds), sequential (a call per chunk, then an answer), infmem, rlm
    rounds: float = 0.0  # ParSer: lead turns that scattered a query; RLM: root turns whose code ran sub-calls
    queries_per_round: float = 1.0
    lead_fill: float = 0.0  # ParSer / RLM: tokens per lead (root) call / its per-turn budget
    subagent_fill: float = 0.0  # ParSer / RLM: tokens per subagent (sub-) call / its budget
    update_fill: float = 0.0  # sequential / InfMem: tokens per call / the update (memory, summary) budget
    turns: float = 0.0  # RLM: root calls (its iterations, and the fallback call if it ran)
    read_fraction: float = 1.0  # InfMem: chunks planned over / its chunks (1.0: no early stop)

    def __post_init__(self):
        if self.kind not in SIMULATIONS:
            raise ValueError(f"Shape.kind={self.kind!r}; expected one of {sorted(SIMULATIONS)}")

    @classmethod
    def from_counts(cls, kind: str, *, calls: Mapping[str, float], decoded: Mapping[str, float],
                    budgets: Mapping[str, int], critical_path: float, chunks: float,
                    read_fraction: float = 1.0) -> "Shape":
        """From one sample's mean counts: model calls and tokens decoded per role, the CPU run's
        per-call budgets, the critical-path calls and the chunks read. ParSer: lead, round, lead,
        ..., lead = 2 x rounds + 1. RLM: its root calls are the lead's and each sub-call step on the
        critical path lies between two of them; a map turn is two such steps (the batched round and
        its combine), so rounds = ceil((critical path - root calls) / 2). InfMem: `calls` are its
        logical calls (plans, writes, the answer: two requests each with thinking on, one budget
        for both) and `read_fraction` is counted from its trace."""
        def fill(role: str) -> float:
            return min(1.0, decoded.get(role, 0.0) / calls[role] / budgets[role]) if calls.get(role) else 0.0

        if kind == "sequential":
            return cls(kind, update_fill=fill("lead"))
        if kind == "infmem":
            return cls(kind, update_fill=fill("lead"), read_fraction=min(1.0, max(0.0, read_fraction)))
        if kind == "rlm":
            turns = calls.get("lead", 0.0)
            return cls(kind, turns=turns, rounds=math.ceil(max(0.0, critical_path - turns) / 2),
                       lead_fill=fill("lead"), subagent_fill=fill("subagent"))
        rounds = max(0.0, (critical_path - 1) / 2)
        queries = calls.get("subagent", 0.0) / (rounds * chunks) if rounds and chunks else 1.0
        return cls(kind, rounds=rounds, queries_per_round=max(1.0, queries), lead_fill=fill("lead"),
                   subagent_fill=fill("subagent"))


@dataclasses.dataclass(frozen=True)
class PaperBudgets:
    """A method's per-call budgets and chunk size in its paper preset (configs/method/<name>.yaml)."""

    chunk_size: int
    update_tokens: int = 0  # sequential: max_memory_tokens / max_summary_tokens; InfMem: a call's (thinking + answer)
    lead_tokens: int = 0  # ParSer: max_tokens_per_turn; RLM: the root's (the same key)
    subagent_tokens: int = 0  # ParSer: subagent_max_tokens; RLM: sub_max_new_tokens


def _yaml(path: str) -> dict[str, Any]:
    return yaml.safe_load(config_file(path).read_text(encoding="utf-8"))


def paper_cluster() -> Cluster:
    """Table 2's machines: subagents and MemAgent on one H100, the lead on one RTX 3090 (the fitted rates)."""
    spec = load_spec(_yaml(MODEL))
    h100, lead = Rates.load(config_file(RATES)), Rates.load(config_file(LEAD_RATES))
    return Cluster(subagent_rates=h100, subagent_workers=1, lead_rates=lead, memagent_rates=h100, spec=spec)


def workload(doc_tokens: int, shape: Shape | None, budgets: PaperBudgets | None, fills: bool = False) -> Workload:
    """The paper's Table 2 workload at `doc_tokens` with `shape`'s structure in place of the paper's
    (None: the paper's own): ParSer's rounds and queries per round, InfMem's read fraction, RLM's
    root and map turns, each method's chunk size. With `fills`, also each call's output as the
    measured fill of the paper preset's budget; without, the paper workload's output sizes (its
    findings, lead turns, and MemAgent's ~1K memory for every sequential reader) and the planner's
    for the peers (configs/plan/workload/eval.yaml's `infmem_*` / `rlm_*`, the `Workload` defaults)."""
    base = table2.workload(doc_tokens, _yaml(PAPER_WORKLOAD))
    if shape is None or budgets is None:
        return base

    def filled(fill: float, budget: int) -> int:
        return max(1, round(fill * budget))

    if shape.kind == "scatter":
        wl = dataclasses.replace(base, chunk_size=budgets.chunk_size, num_chunks=None,
                                 rounds=max(1, round(shape.rounds)), queries_per_round=shape.queries_per_round)
        if fills:
            wl = dataclasses.replace(wl, subagent_output_tokens=(filled(shape.subagent_fill, budgets.subagent_tokens),),
                                     lead_output_tokens=filled(shape.lead_fill, budgets.lead_tokens))
        return wl
    if shape.kind == "rlm":
        turns = max(1, round(shape.turns))
        wl = dataclasses.replace(base, rlm_turns=turns, rlm_map_turns=min(round(shape.rounds), turns - 1))
        if fills:
            wl = dataclasses.replace(wl, rlm_root_output_tokens=filled(shape.lead_fill, budgets.lead_tokens),
                                     rlm_sub_output_tokens=filled(shape.subagent_fill, budgets.subagent_tokens))
        return wl
    if shape.kind == "infmem":
        wl = dataclasses.replace(base, infmem_chunk_size=budgets.chunk_size, infmem_read_fraction=shape.read_fraction)
        if fills:  # a plan and a write have the same budget: both outputs scale by the one fill
            out = filled(shape.update_fill, budgets.update_tokens)
            wl = dataclasses.replace(wl, memory_tokens=out, infmem_plan_tokens=out)
        return wl
    wl = dataclasses.replace(base, memagent_chunk_size=budgets.chunk_size)
    return dataclasses.replace(wl, memory_tokens=filled(shape.update_fill, budgets.update_tokens)) if fills else wl


def seconds(doc_tokens: int, shape: Shape | None, budgets: PaperBudgets | None, kind: str,
            cluster: Cluster | None = None, fills: bool = False) -> float:
    """Projected amortized seconds per sample at concurrency 1 (Table 2's metric), by `kind`'s simulation."""
    cluster = cluster or paper_cluster()
    return SIMULATIONS[kind](workload(doc_tokens, shape, budgets, fills), cluster).amortized_s


def project(shapes: Mapping[str, Shape], budgets: Mapping[str, PaperBudgets], reference: str = "ParSer",
            lengths: tuple[int, ...] = table2.LENGTHS, timed: Mapping[str, str] = PAPER_TIMED) -> list[dict[str, Any]]:
    """Per paper length and method: projected seconds from the measured structure (`seconds`) and
    with the measured output fills too (`seconds_fills`), each over the reference's (`ratio`,
    `ratio_fills`), and for the methods the paper timed (`timed`: row -> its kind) the same
    simulation on the paper's workload and the paper's figures (None for every other method)."""
    cluster = paper_cluster()
    paper_s = {"scatter": table2.PARSER_S, "sequential": table2.MEMAGENT_S}
    rows = []
    for n in lengths:
        paper_workload = {kind: seconds(n, None, None, kind, cluster) for kind in paper_s}
        ours = {name: seconds(n, shape, budgets[name], shape.kind, cluster) for name, shape in shapes.items()}
        filled = {name: seconds(n, shape, budgets[name], shape.kind, cluster, fills=True)
                  for name, shape in shapes.items()}
        index = table2.LENGTHS.index(n) if n in table2.LENGTHS else None
        for name, value in ours.items():
            kind = timed.get(name)
            rows.append({"doc_tokens": n, "method": name, "seconds": value, "seconds_fills": filled[name],
                         "ratio": value / ours[reference] if reference in ours else None,
                         "ratio_fills": filled[name] / filled[reference] if reference in filled else None,
                         "paper_workload_s": paper_workload.get(kind), "paper_s": paper_s.get(kind, {}).get(n),
                         "paper_ratio": table2.RATIO[index] if index is not None and kind == "sequential" else None})
    return rows
