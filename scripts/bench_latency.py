"""CPU latency bench: every long-document method against the floor — the cost of reading the
document once — measured in the same run, with compute and critical path reported apart (the
paper's Table 2 / Figure 3 at CPU scale, and projected to the paper's lengths).

Per length, on the same backend (SmolLM2-135M in process, offline; `--vllm URL` for a server):
1. The floor: every chunk's ParSer subagent prompt prefilled, all chunks in flight at once as a
   scatter round sends them, one token each (no decode forward) — `eval.latency.read_once`.
   A length whose resident chunk prefixes would not fit the backend's prefix cache (or the
   machine) is refused with the figure before anything runs at it.
2. Every method in METHODS (ParSer, MemAgent, ReMemR1, CoA, RLM, InfMem) through `eval.run` on
   the same synthetic-world samples (built once per invocation), one at a time: amortized seconds
   per sample and that time over the floor ("x floor", `eval.report.floor_table`), Sub_EM, the
   method's own steps, the calls on the critical path (the longest chain of model calls each
   waiting for the previous), tokens prefilled and decoded and the FLOPs they imply
   (2 x parameters x tokens), peak resident memory and prefix-cache bytes.
3. Ratios, each named: "time" (baseline wall / ParSer wall, `eval.report.speedups`: on two CPU
   cores a ratio of compute), "compute" (FLOPs), "critical path" (sequential calls: the paper's
   ratio on GPUs).
4. Where the time goes (in process): prefill, subagent decode, lead decode, grammar, gather,
   Python overhead (`eval.latency.Profile`).
5. The capacity planner's projection of each method to 7K..896K tokens on the paper's hardware
   from these counts (`parser.plan.project`), beside the paper's Table 2 (78.22 s vs 876.20 s)
   for the two methods it timed.
6. Targets (printed, never a timed test): ParSer <= 2.5x the floor at 100 paragraphs and more,
   projected MemAgent/ParSer at 896K within 20% of the paper's 11.2x; a missed target names the
   part of the time that holds it back.

How each method is counted (calls are logged at the backend edge, `eval.latency.Recorder`; the
critical path is the longest chain of logged calls each starting after the previous one ended, so
calls in flight together count once):
- ParSer: lead turns on the lead role, each scatter round's subagent calls on the subagent role;
  critical path lead, round, lead, ..., answer = 2 x rounds + 1.
- MemAgent, ReMemR1, CoA: every call on the lead role, one after another: chunks + 1.
- RLM: root calls (its iterations, and rlms' fallback call when no code set the answer) on the
  lead role; the REPL's sub-calls on the subagent role. One `llm_query_batched` sends its prompts
  together (`asyncio.gather` under the method's `episode.max_concurrency` request slots), so a
  batch counts once, or once per wave past those slots; `llm_query` calls in a cell, and cells of
  a turn, run one after another and each counts. Steps = root calls. Its REPL (the worker's
  start and isolation, the cells' own run time) is no model call: in the profile it falls under
  Python overhead, as its tokens fall under no role.
- InfMem: plans, writes and the answer, all on the lead role, one after another; with thinking on
  (its default and its CPU config) each is two requests (the thinking stage, then the answer
  stage), so the critical path is 2 x steps, where steps = plans + writes + 1 (2 x chunks + 1
  when it never stops; its early stop after `early_stop` STOP plans ends the reading). Its BM25
  retrieval is no model call: Python overhead in the profile. How much of the document it planned
  over (its trace's plans / chunks) is what the projection carries as `read_fraction`.
The paper timed neither RLM nor InfMem: their projected rows have no paper reference ("–").

Wall-clock figures are whatever the machine gave the run: the bench prints the load average
at its start and end. Each method writes a normal eval run directory and the floor goes to
`floor.jsonl`, so `parser report outputs/bench --out outputs/bench/report` draws the speedup plot
with the floor. Adding a method is one line in METHODS: its CPU config, its paper config, the
planner simulation that projects it and the key of its per-call budget.

    .venv/bin/python scripts/bench_latency.py                          # 12/24/48 paragraphs, ~10 min on 2 cores
    .venv/bin/python scripts/bench_latency.py dataset.lengths=[12,48] dataset.num_questions=2
    .venv/bin/python scripts/bench_latency.py --methods parser memagent   # any of parser memagent rememr1 coa rlm infmem
    .venv/bin/python scripts/bench_latency.py --config-name bench_length_cpu   # make bench-length: 100-800 paragraphs
    .venv/bin/python scripts/bench_latency.py --smoke                  # seconds: tiny random models (the suite runs it)
    .venv/bin/python scripts/bench_latency.py --vllm http://127.0.0.1:8000    # SmolLM2 served by vLLM, started with
                                                   # VLLM_SERVER_DEV_MODE=1: the bench empties its prefix cache per phase
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict

from eval import latency as lat
from eval.datasets import Subset, load_subsets
from eval.report import floor_table, latency_table, load, partial_mark, speedups, table_to_markdown, trace_costs
from eval.run import build_eval_method, evaluate, warm_up
from eval.store import read_results
from parser.base.config import EpisodeConfig
from parser.base.redact import redact
from parser.base.resources import config_dir
from parser.plan import project

CONFIGS = config_dir()
# name -> (CPU config, paper config, the simulation that projects it (parser.plan.project.SIMULATIONS),
# the key of its per-call budget beside its episode's: a sequential reader's update, RLM's sub-call,
# InfMem's answer stage (its thinking stage added when thinking is on); None: ParSer's episode budgets)
METHODS = {
    "parser": ("parser_cpu", "parser", "scatter", None),
    "memagent": ("memagent_cpu", "memagent", "sequential", "max_memory_tokens"),
    "rememr1": ("rememr1_cpu", "rememr1", "sequential", "max_memory_tokens"),
    "coa": ("coa_cpu", "coa", "sequential", "max_summary_tokens"),
    "rlm": ("rlm_cpu", "rlm", "rlm", "sub_max_new_tokens"),
    "infmem": ("infmem_cpu", "infmem", "infmem", "max_new_tokens"),
}
REFERENCE = "parser"  # the method every ratio and target is taken against (a method name, not a protocol)
# --smoke: the same bench on tiny random-weight models, one short length, no warm-up
SMOKE = ["backend@models=tiny_cpu", "dataset.lengths=[12]", "dataset.num_questions=1", "warmup=0"]
# --smoke, one method's own: a random tiny model never stops InfMem's reading (its plans make no call and say
# no STOP, which counts one and never more: rules.stop_count), so the smoke stops it at its first plan — the
# early stop's path, 2 calls (4 requests) instead of 13 (26), and a read fraction below 1 for the projection
SMOKE_METHOD = {"infmem": ["method.early_stop=1"]}
RESET_TIMEOUT_S, RESET_MAX_BYTES = 60.0, 4096  # --vllm: the prefix-cache reset's deadline and reply bound
TARGET_FLOOR_X, TARGET_FROM_L = 2.5, 100  # ParSer <= 2.5x the floor at 100 paragraphs and more
TARGET_RATIO, TARGET_TOLERANCE = 11.2, 0.2  # projected MemAgent/ParSer at 896K within 20% of the paper's


def compose_method(name: str, config: str, overrides: list[str], out: Path) -> DictConfig:
    return compose(config, overrides=[f"hydra.searchpath=[file://{CONFIGS}]", f"method={name}",
                                      f"out_dir={out}", *overrides])


# ----------------------------------------------------------------------------- the floor

async def measure_floor(cfg: DictConfig, subsets: list, refuse: bool) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Per length: mean floor seconds, chunks, prompt tokens and the resident KV bytes it left in
    the prefix cache; and the lengths refused (their figure), checked before anything runs."""
    method = build_eval_method(cfg)
    backend, tokenizer = method.models.subagent or method.models.lead, method.models.subagent_tokenizer
    floors, refusals = {}, []
    try:
        per_token = await asyncio.to_thread(lat.kv_bytes_per_token, backend, tokenizer)
        warm = int(cfg.warmup) > 0
        for subset in subsets:
            why = None
            if refuse and per_token is not None:  # an in-process prefix cache: its bytes bound the length
                sizes = [lat.prompt_tokens(method, tokenizer, s) for s in subset.samples]
                why = lat.kv_refusal(subset.length, max(sizes, key=sum), per_token, backend, lat.available_bytes())
            if why:
                refusals.append(why)
                continue
            if warm:  # the first prefill of a fresh process is slower: keep it out of the floor
                await lat.read_once(method, backend, tokenizer, subset.samples[0], key="floor-warmup")
                warm = False
            runs = [await lat.read_once(method, backend, tokenizer, s) for s in subset.samples]
            cached = getattr(backend, "cache_info", dict)()
            kv = max(sum(e["bytes"] for k, e in cached.items() if k.startswith(f"floor:{s.id}:")) for s in subset.samples)
            floors[subset.length] = {"seconds": sum(r["seconds"] for r in runs) / len(runs),
                                     "chunks": sum(r["chunks"] for r in runs) / len(runs),
                                     "prompt_tokens": sum(r["prompt_tokens"] for r in runs) / len(runs),
                                     "kv_bytes": kv, "kv_bytes_per_token": per_token}
    finally:
        await method.aclose()
    return floors, refusals


# ----------------------------------------------------------------------------- one method

async def run_method(cfg: DictConfig, subsets: list[Subset]) -> tuple[dict[int, dict[str, Any]], int | None, int]:
    """Run one method's eval on `subsets` (built once for every method) with its backends recorded
    and profiled; returns its counts per length (InfMem's also its `read_fraction`), the model's
    parameter count (None: not in process) and eval's exit status."""
    from parser.serving.backends.models import build_models

    recorder = lat.Recorder(build_models(OmegaConf.to_container(cfg.models, resolve=True)))
    method = build_eval_method(cfg, recorder.models)
    raw = recorder.raw.lead
    profile = lat.Profile(recorder).attach(raw, method)
    params = sum(p.numel() for p in raw.model.parameters()) if profile.attached else None
    try:
        warmup = int(cfg.warmup)
        with open_dict(cfg):
            cfg.warmup = 0  # warmed up here, so the call log holds the timed samples only
        await warm_up(method, subsets, warmup)
        recorder.clear()
        profile.events.clear()
        with lat.MemoryWatch(raw) as watch:
            status = await evaluate(cfg, method, subsets)
    finally:
        await method.aclose()
    rows = read_results(cfg.out_dir)
    counts = lat.per_length(rows, recorder.calls, profile, watch)
    for L, own in trace_counts(rows).items():
        counts.get(L, {}).update(own)
    return counts, params, status


def trace_counts(rows: list) -> dict[int, dict[str, float]]:
    """Per length, the means of what a method counted itself in its traces (`eval.report.trace_costs`):
    `sub_calls` (ParSer's subagent requests, RLM's sub-calls: checked against the calls logged on
    the subagent role) and `read_fraction` (InfMem: its plans over its chunks, the share of the
    document it read before its early stop); a count no row holds is left out."""
    by: dict[int, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in rows:
        if r.condition is not None:
            continue
        costs = trace_costs(r.trace)
        if "sub_calls" in costs:
            by[r.length]["sub_calls"].append(costs["sub_calls"])
        if "plans" in costs and r.trace.num_chunks:
            by[r.length]["read_fraction"].append(costs["plans"] / r.trace.num_chunks)
    return {L: {k: sum(v) / len(v) for k, v in own.items()} for L, own in by.items()}


def budgets(method: DictConfig, kind: str, key: str | None) -> tuple[dict[str, int], project.PaperBudgets]:
    """(per-call output budgets by role, the same as `PaperBudgets`) from a method config: ParSer's
    episode (lead turn, subagent reply, chunk); RLM's root turn (its episode's) and sub-call (`key`;
    it reads no chunks, its code slices the document); InfMem's call (`key`, plus `thinking_budget`
    with thinking on: its two requests share one logical call) and chunk; a sequential reader's
    update (`key`) and chunk."""
    if kind in ("scatter", "rlm"):
        episode = EpisodeConfig(**OmegaConf.to_container(method.episode, resolve=True))
        sub, chunk = (episode.subagent_max_tokens, episode.chunk_size) if kind == "scatter" else (int(method[key]), 0)
        return {"lead": episode.max_tokens_per_turn, "subagent": sub}, project.PaperBudgets(
            chunk, lead_tokens=episode.max_tokens_per_turn, subagent_tokens=sub)
    update = int(method[key]) + (int(method.thinking_budget) if kind == "infmem" and method.thinking else 0)
    return {"lead": update}, project.PaperBudgets(int(method.chunk_size), update_tokens=update)


# ----------------------------------------------------------------------------- tables

def gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def print_tables(latency: list[dict], counts: dict[str, dict], floors: dict[int, dict], floor_lines: list[dict],
                 rows: dict[str, str], params: int | None) -> dict[tuple[str, int], float]:
    """The per-invocation tables; returns each (method, length)'s time over the floor (`floor_table`)."""
    print("\n## Floor: the document read once (every chunk's subagent prompt prefilled, no decoding)\n")
    print(table_to_markdown(["length (paragraphs)", "floor s", "chunks", "tokens prefilled", "tokens/s",
                             "resident KV (GiB)", "KV KiB/token"],
                            [[str(L), f"{f['seconds']:.2f}", f"{f['chunks']:.0f}", f"{f['prompt_tokens']:.0f}",
                              f"{f['prompt_tokens'] / f['seconds']:.0f}", gib(f["kv_bytes"]),
                              f"{f['kv_bytes_per_token'] / 1024:.1f}" if f["kv_bytes_per_token"] else "n/a"]
                             for L, f in sorted(floors.items())]))
    flops = "FLOPs (2·params·tokens)" + (f", params {params:,}" if params else "")
    header = ["method", "length", "s/sample", "x floor", "Sub_EM", "steps", "critical-path calls", "calls", "failed calls",
              "tokens prefilled (lead / subagents)", "tokens decoded (lead / subagents)", flops, "peak RSS GiB", "peak prefix cache GiB", "samples"]
    body, over = [], {}
    names = {row: name for name, row in rows.items()}
    for e in floor_table(latency, floor_lines):
        name = names.get(e["row"])
        c = counts.get(name, {}).get(e["length"])
        if c is None:
            continue
        over[(name, e["length"])] = x = e["x_floor"]
        tokens = c["prefilled"] + c["decoded"]
        body.append([e["row"], str(e["length"]), f"{e['amortized_s']:.2f}", f"{x:.2f}x", f"{100 * c['sub_em']:.0f}",
                     f"{c['steps']:.1f}", f"{c['critical_path']:.1f}", f"{c['calls']:.0f}", f"{c['failed_calls']:.0f}",
                     f"{c['prefilled']:.0f} ({c['lead_prefilled']:.0f} / {c['subagent_prefilled']:.0f})",
                     f"{c['decoded']:.0f} ({c['lead_decoded']:.0f} / {c['subagent_decoded']:.0f})",
                     f"{2 * params * tokens:.2e}" if params else "n/a",
                     gib(c["peak_rss"]), gib(c["peak_cache"]), str(e["samples"])])
    print("\n## Every method against the floor (means per sample; s/sample amortized as in the paper)\n")
    print(table_to_markdown(header, body))
    return over


def print_ratios(counts: dict[str, dict], latency: list[dict], rows: dict[str, str], reference: str) -> None:
    """Time from `eval.report.speedups`; compute and critical path from the counts (checked non-zero
    by `refuse_nonsense` before this runs)."""
    names = {row: name for name, row in rows.items()}
    body = []
    for s in speedups(latency, parser_row=rows[reference]):
        c, ref = counts.get(names.get(s["baseline"]), {}).get(s["length"]), counts[reference].get(s["length"])
        if c is None or ref is None:
            continue
        body.append([s["baseline"], str(s["length"]), f"{s['speedup']:.2f}x",
                     f"{(c['prefilled'] + c['decoded']) / (ref['prefilled'] + ref['decoded']):.2f}x",
                     f"{c['critical_path'] / ref['critical_path']:.2f}x"])
    if body:
        print(f"\n## Ratios to {rows[reference]}: time = wall clock (on 2 CPU cores, a ratio of compute); "
              "compute = tokens (FLOPs); critical path = sequential model calls (the paper's ratio on GPUs)\n")
        print(table_to_markdown(["baseline", "length", f"time ratio (baseline / {rows[reference]})", "compute ratio",
                                 "critical-path ratio"], body))


def print_profile(counts: dict[str, dict], rows: dict[str, str]) -> None:
    body = []
    for name, per in counts.items():
        for L, c in sorted(per.items()):
            parts, wall = c["parts"], c["wall_s"]
            if not wall or not any(v for k, v in parts.items() if k != "Python overhead"):
                continue
            body.append([rows[name], str(L), f"{wall:.2f}",
                         *(f"{parts[p]:.2f} ({parts[p] / wall:.0%})" for p in lat.PROFILE_PARTS)])
    if body:
        print("\n## Where a sample's time goes (s, share of its wall time; in process; Python overhead = wall - the rest)\n")
        print(table_to_markdown(["method", "length", "wall s", *lat.PROFILE_PARTS], body))


def print_projection(counts: dict[str, dict], floors: dict[int, dict], shapes_cfg: dict[str, tuple], rows: dict[str, str],
                     reference: str) -> list[dict]:
    """The planner's projection from the longest measured length's counts (`parser.plan.project`)."""
    shapes, paper = {}, {}
    for name, (kind, cpu_budgets, paper_budgets) in shapes_cfg.items():
        per = counts.get(name)
        if not per:
            continue
        L = max(per)
        c = per[L]
        # InfMem's budget is per logical call (its steps), whichever of its one or two requests spent it
        lead = c["steps"] if kind == "infmem" else c["calls"] - c["subagent_calls"] - c["failed_calls"]
        shapes[rows[name]] = project.Shape.from_counts(
            kind, calls={"lead": lead, "subagent": c["subagent_calls"]},
            decoded={"lead": c["lead_decoded"], "subagent": c["subagent_decoded"]}, budgets=cpu_budgets,
            critical_path=c["critical_path"], chunks=floors.get(L, {}).get("chunks", 0),
            read_fraction=c.get("read_fraction", 1.0))
        paper[rows[name]] = paper_budgets
    if rows[reference] not in shapes:
        return []
    projected = project.project(shapes, paper, reference=rows[reference])
    print("\n## Projected to the paper's lengths on its hardware (parser.plan.project: Table 2's fitted H100 / RTX 3090 "
          "rates, concurrency 1; the measured structure = ParSer's rounds and queries per round, each method's chunk "
          "size, the paper's output sizes; the fills column also scales outputs by the measured budget fills)\n")
    for name, shape in shapes.items():
        print(f"- {name}: {describe(shape)}")
    untimed = [name for name in shapes if name not in project.PAPER_TIMED]
    if untimed:  # never a reference made up for them
        peers = [name for name in untimed if shapes[name].kind in ("rlm", "infmem")]
        print(f"- the paper timed only {' and '.join(project.PAPER_TIMED)} (Table 2): {', '.join(untimed)} have no "
              "paper reference (–)" + (f"; {' and '.join(peers)} run the planner's own simulations (parser.plan.simulate; "
                                       "RLM's sub-call slices are its modelled strategy's, rlms' ~100K characters)"
                                       if peers else ""))
    body = [[f"{r['doc_tokens'] // 1000}K", r["method"], f"{r['seconds']:.2f}", f"{r['ratio']:.2f}x",
             f"{r['seconds_fills']:.2f}", f"{r['ratio_fills']:.2f}x",
             f"{r['paper_workload_s']:.2f}" if r["paper_workload_s"] else "–", f"{r['paper_s']:.2f}" if r["paper_s"] else "–",
             f"{r['paper_ratio']:.1f}x" if r["paper_ratio"] else "–"] for r in projected]
    print("\n" + table_to_markdown(["length", "method", "projected s (measured structure)", f"/ {rows[reference]}",
                                    "with measured output fills", f"/ {rows[reference]}", "paper's workload s",
                                    "paper Table 2 s", "paper ratio"], body))
    return projected


def describe(shape: project.Shape) -> str:
    """The measured structure a shape carries, in words."""
    if shape.kind == "scatter":
        return (f"{shape.rounds:.1f} query rounds, {shape.queries_per_round:.2f} queries/round, lead fills "
                f"{shape.lead_fill:.0%} of its turn budget, subagents {shape.subagent_fill:.0%}")
    if shape.kind == "rlm":
        return (f"{shape.turns:.1f} root calls, {shape.rounds:.0f} of them ran sub-calls (map turns), root fills "
                f"{shape.lead_fill:.0%} of its turn budget, sub-calls {shape.subagent_fill:.0%}")
    if shape.kind == "infmem":
        return (f"planned over {shape.read_fraction:.0%} of its chunks before it stopped, each call fills "
                f"{shape.update_fill:.0%} of its budget (thinking and answer stages)")
    return f"each update fills {shape.update_fill:.0%} of its budget"


def check_targets(over: dict[tuple[str, int], float], counts: dict[str, dict], floors: dict[int, dict],
                  projected: list[dict], rows: dict[str, str], backend: str) -> None:
    print(f"\n## Targets (SmolLM2 {backend}, nothing else running; figures above are this run's)\n")
    long = {L: x for (name, L), x in over.items() if name == REFERENCE and L >= TARGET_FROM_L}
    if not long:
        print(f"- ParSer <= {TARGET_FLOOR_X}x the floor at >= {TARGET_FROM_L} paragraphs: not measured in this run "
              "(make bench-length)")
    for L, x in sorted(long.items()):
        # what the sample spent beyond the floor: the floor is prefill, so only prefill above it counts
        parts = {**counts[REFERENCE][L]["parts"]}
        parts["prefill"] = max(0.0, parts["prefill"] - floors[L]["seconds"])
        part = lat.slowest_part(parts)
        above = counts[REFERENCE][L]["wall_s"] - floors[L]["seconds"]
        why = (f"largest part beyond the floor: {part} ({parts[part]:.1f} s of the {above:.1f} s above it)"
               if any(v for k, v in parts.items() if k != "Python overhead") else
               f"{above:.1f} s above it, not split: the profile needs the in-process backend")
        verdict = "met" if x <= TARGET_FLOOR_X else f"MISSED; {why}"
        print(f"- ParSer at L={L}: {x:.2f}x the floor (target <= {TARGET_FLOOR_X}x): {verdict}")
    for name, per in counts.items():
        for L, c in sorted(per.items()):
            if c["failed_calls"]:
                print(f"- warning: {rows[name]} at L={L} had {c['failed_calls']:.0f} failed model calls per sample "
                      "(timeouts, retried): its time includes the retries; rerun on a quieter machine")
    last = {r["method"]: r for r in projected if r["doc_tokens"] == project.table2.LENGTHS[-1]}
    if "MemAgent" in last:
        ratio = last["MemAgent"]["ratio"]
        ok = abs(ratio / TARGET_RATIO - 1) <= TARGET_TOLERANCE
        print(f"- projected MemAgent/{rows[REFERENCE]} at 896K from the measured structure: {ratio:.1f}x (paper "
              f"{TARGET_RATIO}x, target within {TARGET_TOLERANCE:.0%}): " + (
                  "met" if ok else "MISSED; compare the projected seconds with those on the paper's workload above")
              + f"; with the measured output fills {last['MemAgent']['ratio_fills']:.1f}x")


def refuse_nonsense(latency: list[dict], counts: dict[str, dict], floors: dict[int, dict], methods: list[str],
                    rows: dict[str, str], failed: dict[str, set[int]]) -> None:
    """A figure that cannot be right stops the bench (exit 1) before any ratio divides by it: the
    smoke run catches a rotted bench. (The floors were checked before any method ran: `check_floors`.)
    A length whose samples failed (`failed`, from the method's errors.jsonl) has no row by right: it
    is said at the end (`say_failed`), and the lengths that did run are still reported."""
    problems = []
    for name in methods:
        have = {e["length"] for e in latency if e["row"] == rows[name]}
        problems += [f"{name}: no timed row at L={L}" for L in floors if L not in have and L not in failed.get(name, ())]
        problems += [f"{name} at L={L}: {c['calls']} model calls, {c['critical_path']} on the critical path"
                     for L, c in counts.get(name, {}).items() if not (c["calls"] > 0 and c["critical_path"] > 0)]
        # the roles as the method counted them (a retried call is logged once per attempt: compared without failures)
        problems += [f"{name} at L={L}: {c['subagent_calls']} calls logged on the subagent role, the method counted "
                     f"{c['sub_calls']}" for L, c in counts.get(name, {}).items()
                     if "sub_calls" in c and not c["failed_calls"] and not math.isclose(c["subagent_calls"], c["sub_calls"])]
    problems += [f"{e['row']} at L={e['length']}: {e['amortized_s']!r} s/sample" for e in latency
                 if not (math.isfinite(e["amortized_s"]) and e["amortized_s"] > 0)]
    if problems:
        raise SystemExit("bench_latency: nonsense figures: " + "; ".join(problems))


def say_failed(failed: dict[str, set[int]], out: Path) -> None:
    """Exit 1 naming each method and length whose samples failed, after every table the run could fill."""
    if any(failed.values()):
        raise SystemExit("bench_latency: samples failed: " + "; ".join(
            f"{name} at L={', '.join(map(str, sorted(lengths)))} ({out / name}/errors.jsonl)"
            for name, lengths in failed.items() if lengths))


def empty_prefix_cache(url: str) -> bool:
    """Empty a vLLM server's prefix cache before a phase (`POST /reset_prefix_cache`, its dev API:
    the server started with VLLM_SERVER_DEV_MODE=1), so no method reuses what the floor or the
    method before it prefilled; in process every phase builds fresh models instead. Measured without
    it: ParSer's first round reused the floor's whole prefill on vLLM (6,742 subagent tokens
    prefilled against 15,846 in process) and came out at 1.79x the floor. Says so and returns False
    when the server refuses: the figures after the first phase are then optimistic."""
    request = urllib.request.Request(f"{url.rstrip('/')}/reset_prefix_cache", data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=RESET_TIMEOUT_S) as reply:
            why = None if json.loads(reply.read(RESET_MAX_BYTES) or b"{}").get("success") else "it answered success=false"
    except (OSError, ValueError) as error:  # urllib's HTTPError/URLError are OSErrors; a non-JSON body a ValueError
        why = f"{type(error).__name__}: {error}"
    if why:
        print(f"[bench] warning: the server's prefix cache could not be emptied ({redact(why)}): what the floor or an "
              "earlier method prefilled may be reused, so later figures are optimistic; start vLLM with "
              "VLLM_SERVER_DEV_MODE=1 (its dev API) so the bench can empty it before each phase")
    return why is None


def check_floors(floors: dict[int, dict]) -> None:
    """The floor divides every method's time: a floor that is not a positive time, or no length
    measured at all, stops the bench (exit 1) before any method runs."""
    problems = [f"floor at L={L}: {f['seconds']!r} s" for L, f in floors.items()
                if not (math.isfinite(f["seconds"]) and f["seconds"] > 0)]
    if not floors:
        problems.append("no length was measured")
    if problems:
        raise SystemExit("bench_latency: nonsense figures: " + "; ".join(problems))


# ----------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of configs/eval/<config-name>.yaml")
    ap.add_argument("--config-name", default="bench_cpu", help="bench_cpu (minutes) | bench_length_cpu (long lengths)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), metavar="METHOD",
                    help=f"any of {' '.join(METHODS)} (default: all); parser is the reference and always runs, first")
    ap.add_argument("--out", default=None, help="run directories go here (replaced); default outputs/bench[_vllm]")
    ap.add_argument("--smoke", action="store_true", help="seconds-long run on tiny models (keeps the bench from rotting)")
    ap.add_argument("--vllm", metavar="URL", help="lead and subagents on this vLLM server (configs/backend/vllm.yaml), "
                                                  "serving the SmolLM2 weights of parser.offline.assets.smollm2_dir")
    args = ap.parse_args()
    vllm = ["backend@models=vllm", *(f"models.{role}.{key}={value}" for role in ("lead", "subagent")
                                     for key, value in (("base_url", args.vllm), ("tokenizer", "smollm2")))] if args.vllm else []
    overrides = [*(SMOKE if args.smoke else []), *vllm, *args.overrides]
    out = Path(args.out or ("outputs/bench_vllm" if args.vllm else "outputs/bench"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if out.exists():
        shutil.rmtree(out)  # one invocation = one measurement; never mix with an older run
    methods = [REFERENCE, *(m for m in args.methods if m != REFERENCE)]
    print(f"[bench] machine at start: {lat.machine_load()} (wall-clock figures are noisy on a shared machine)")
    start = time.perf_counter()

    with initialize_config_dir(config_dir=str(CONFIGS / "eval"), version_base="1.3"):
        cfgs = {m: compose_method(METHODS[m][0], args.config_name,
                                  [*overrides, *(SMOKE_METHOD.get(m, []) if args.smoke else [])], out / m) for m in methods}
        papers = {m: compose_method(METHODS[m][1], args.config_name, overrides, out / m).method for m in methods}
    reference = cfgs[REFERENCE]
    if int(reference.concurrency) != 1:
        raise SystemExit("bench_latency: concurrency must be 1 (samples one at a time: the counts are split by sample)")
    subsets = load_subsets(reference.dataset, limit=reference.limit, max_file_bytes=reference.max_data_file_bytes)  # once: every method reads these samples
    if args.vllm:  # in process, every phase builds its own models: an empty prefix cache
        empty_prefix_cache(args.vllm)
    floors, refusals = asyncio.run(measure_floor(reference, subsets, refuse=not args.vllm))
    for why in refusals:
        print(f"[bench] refused {why}")
    check_floors(floors)
    floor_lines = [{"dataset": str(reference.dataset.name), "backbone": str(reference.report.backbone), "length": L, **f}
                   for L, f in sorted(floors.items())]
    lat.write_floors(out, floor_lines)  # kept if a long run is stopped
    kept = sorted(floors)
    measured = [s for s in subsets if s.length in floors]
    rows = {m: str(cfgs[m].report.row) for m in methods}
    counts, params, shapes_cfg, failed = {}, None, {}, {}
    for m in methods:
        cfg = cfgs[m]
        with open_dict(cfg):
            cfg.dataset.lengths = kept
        print(f"[bench] {m}: lengths {kept}, {cfg.dataset.num_questions} samples each")
        if args.vllm:
            empty_prefix_cache(args.vllm)
        counts[m], params, status = asyncio.run(run_method(cfg, measured))
        finished = read_results(out / m)
        failed[m] = set(kept) - {r.length for r in finished}
        if status:
            print(f"[bench] {m}: some samples failed; see {out / m}/errors.jsonl")
        # a run that lacks a sample is labelled so in every table (eval.report.partial_mark): match that label
        rows[m] += partial_mark(out / m, finished)
        _, kind, key = METHODS[m][1:]
        shapes_cfg[m] = (kind, budgets(cfg.method, kind, key)[0], budgets(papers[m], kind, key)[1])

    results, timings = load([out / m for m in methods])
    latency = latency_table(results, timings)
    over = print_tables(latency, counts, floors, floor_lines, rows, params)
    refuse_nonsense(latency, counts, floors, methods, rows, failed)
    print_ratios(counts, latency, rows, REFERENCE)
    print_profile(counts, rows)
    projected = print_projection(counts, floors, shapes_cfg, rows, REFERENCE)
    check_targets(over, counts, floors, projected, rows, f"on vLLM at {redact(args.vllm)}" if args.vllm else "in process")
    print(f"\n[bench] machine at end: {lat.machine_load()}; total {time.perf_counter() - start:.0f} s; run directories "
          f"under {out}/ (parser report {out} --out {out}/report draws the speedup plot with the floor)")
    say_failed(failed, out)


if __name__ == "__main__":
    main()
