"""Check the planner against real runs on this machine: calibrate, predict, run, compare.

    parser plan validate                       # tiny-qwen3.5 on 2 CPU workers, ~3.5-5 min
    parser plan validate validate.model=smollm2 validate.chunk_size=64   # slower, a real LM
    parser plan validate validate.smoke=true   # seconds: the pipeline, not the accuracy

0. The paper: `parser.plan.table2` (fit on Table 2's short lengths, predict up to 896K).
1. Start `workers` CPU `parser.serving.server` processes.
2. For each validation workload (document length, concurrency): calibrate the servers' rates
   on synthetic bursts right before it, and run scripted episodes on a calibration document (a
   size not validated on), interleaved with the workload's runs, for the subagents' output
   lengths and the engine's own per-request cost on top of the servers' (added to the rates'
   overhead). On a shared machine the CPU's speed drifts by 2x within minutes with other
   processes' load, so each workload is predicted from rates measured around it — never from
   anything measured on the workload itself.
3. Predict its per-episode latency and amortized time per sample with `simulate_parser` (token
   shapes from the real reader and tokenizer: prefix = instructions + chunk, suffix = query +
   template tail), then run the same episodes for real, `runs_per_workload` times on new
   document ids (cold caches; the medians are compared: a load spike hits single runs):
   `parser.engine.episode.EpisodeEngine` with HTTP subagents over a chunk-pinned `WorkerPool` (the same
   rendezvous hash the simulation uses).

The lead is scripted (it issues `rounds` queries, then answers, in no time): the demo's real
lead is another issue, and what is validated here is the subagent side — scatter, queueing,
per-worker load and prefix-cache reuse. A scripted lead also makes the number of rounds a
workload property, as it is in the paper's step counts. Last line: `max relative error N%`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from parser.serving.types import BackendError, Completion
from parser.serving.backends.http import HttpBackend
from parser.serving.backends.pool import WorkerPool
from parser.text.chat_format import CHATML
from parser.text.chunking import chunk_document
from parser.base.config import EpisodeConfig
from parser.engine.episode import EpisodeEngine
from parser.plan.calibrate import Calibrator, LocalWorkers, default_probes, derived_table, fit_rows, write_rates
from parser.plan.memory import ModelSpec
from parser.plan.rates import Rates
from parser.plan.simulate import Cluster, Workload, simulate_parser
from parser.engine.readers import SubagentReader

CALL = ("</think>\n\n<tool_call>\n<function=query_agents>\n<parameter=query>\n{}\n</parameter>\n</function>\n"
        "</tool_call>")
QUERIES = ("Which place lies on river 3?", "Who founded the largest place?", "What is the population of place 5?",
           "Which river has the most places?", "Name a place founded before 1900.")


class ScriptedLead:
    """A lead backend that takes no time: `rounds` query_agents calls per episode, then an answer.
    It stands in for the trained lead model (a separate issue); the engine around it is real."""

    def __init__(self, tokenizer: Any, rounds: int):
        self.tokenizer, self.rounds = tokenizer, rounds
        self.turns: dict[str, int] = {}
        self.end = CHATML.end_of_turn_id(tokenizer)

    async def generate(self, prompt, sampling, *, routing_key=None, request_id=None) -> Completion:
        if sampling.constraint is not None:  # its text is fixed: it cannot honour a mask
            raise BackendError("ScriptedLead: a scripted lead cannot honour a constraint", retryable=False)
        turn = self.turns.get(request_id, 0)
        self.turns[request_id] = turn + 1
        text = CALL.format(QUERIES[turn % len(QUERIES)]) if turn < self.rounds else "</think><answer>done</answer>"
        return Completion(text="", token_ids=self.tokenizer.encode(text, add_special_tokens=False) + [self.end],
                          finish_reason="stop")

    async def aclose(self) -> None:
        pass


def scripted_engine(reader: SubagentReader, tokenizer: Any, config: EpisodeConfig, rounds: int) -> EpisodeEngine:
    """The real episode engine around a fresh scripted lead (its turn counters start at zero)."""
    return EpisodeEngine(ScriptedLead(tokenizer, rounds), tokenizer, reader, config)


def document(paragraphs: int, seed: int = 0) -> str:
    """A synthetic document of `paragraphs` short fact paragraphs."""
    return "\n\n".join(f"Document {i}:\nPlace {i + seed}\nPlace {i + seed} lies on river {(i * 7 + seed) % 11} and "
                       f"has {(i * 131 + seed) % 9973} people; it was founded in {1700 + (i * 37) % 300}."
                       for i in range(1, paragraphs + 1))


@dataclasses.dataclass
class Shape:
    """Token shapes of one document's subagent requests (from the real reader and tokenizer)."""

    chunks: int
    prefix_tokens: int  # mean reusable prefix per chunk
    suffix_tokens: int  # mean query + tail


def measure_shape(reader: SubagentReader, tokenizer: Any, text: str, chunk_size: int) -> tuple[Shape, list[Any]]:
    chunks = chunk_document(text, tokenizer, chunk_size)
    prefixes, suffixes = [], []
    for chunk in chunks:
        a = tokenizer.encode(reader.prompt(QUERIES[0], chunk), add_special_tokens=False)
        b = tokenizer.encode(reader.prompt(QUERIES[1], chunk), add_special_tokens=False)
        common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                      min(len(a), len(b)))  # the prompts differ in length past their common prefix
        prefixes.append(common)
        suffixes.append(len(a) - common)
    return Shape(len(chunks), round(statistics.mean(prefixes)), round(statistics.mean(suffixes))), chunks


async def cold_run(make_engine: Callable[[], EpisodeEngine], chunks: Sequence[Any], samples: int, concurrency: int,
                   doc_prefix: str) -> tuple[str, float, float, list[Any]]:
    """`run_episodes` with a fresh engine (and scripted lead) on document ids `{doc_prefix}doc{i}`,
    which must be new: every run starts with cold prefix caches, as its prediction does
    (parser.serving.server's /flush_cache does not empty the CPU backend's cache). Returns (doc prefix,
    mean latency, amortized time, trajectories)."""
    prefix = f"{doc_prefix}doc"
    latency, per_sample, trajectories = await run_episodes(make_engine(), chunks, samples, concurrency, prefix)
    return prefix, latency, per_sample, trajectories


async def run_episodes(engine: EpisodeEngine, chunks: Sequence[Any], samples: int, concurrency: int,
                       doc_prefix: str) -> tuple[float, float, list[Any]]:
    """(mean episode wall time, makespan / samples, trajectories)."""
    slots = asyncio.Semaphore(concurrency)

    async def one(sample: int):
        async with slots:
            return await engine.run("Which place has the most people?", list(chunks), doc_id=f"{doc_prefix}{sample}")

    started = time.perf_counter()
    trajectories = await asyncio.gather(*(one(s) for s in range(samples)))
    makespan = time.perf_counter() - started
    return statistics.mean(t.wall_s for t in trajectories), makespan / samples, trajectories


def workload_for(shape: Shape, outputs: Sequence[int], cfg: dict[str, Any], concurrency: int, samples: int,
                 prefix: str) -> Workload:
    # the measured prefix is instructions + chunk, so the frame is folded into doc_tokens
    return Workload(doc_tokens=shape.chunks * shape.prefix_tokens, num_chunks=shape.chunks, chunk_size=cfg["chunk_size"],
                    frame_tokens=0, query_tokens=shape.suffix_tokens, subagent_output_tokens=tuple(outputs),
                    rounds=cfg["rounds"], queries_per_round=1, concurrency=concurrency, samples=samples,
                    seed=cfg["seed"], doc_id_prefix=prefix)


def cluster_for(rates: Rates, spec: ModelSpec, cfg: dict[str, Any]) -> Cluster:
    return Cluster(subagent_rates=rates, subagent_workers=cfg["workers"], spec=spec, cache_bytes=cfg["cache_bytes"],
                   cache_entries=cfg["cache_entries"], routing="rendezvous",
                   snapshot_every=cfg["snapshot_every"] if spec.linear_attention_layers else None)


async def calibrate_servers(calibrator: Calibrator, cfg: dict[str, Any], path: Path) -> Rates:
    """The servers' rates, from synthetic bursts only."""
    probes = default_probes(cfg["calibrate_batches"], cfg["calibrate_lengths"], cfg["calibrate_outputs"])
    rows = await calibrator.run(probes, cfg["calibrate_repeats"])
    rates, stats = fit_rows(rows, 1, source=f"parser plan validate: {cfg['workers']} parser.serving.server "
                                             f"workers, {cfg['model']}, {cfg['threads_per_worker']} thread(s) each")
    table = derived_table(rates, cfg["calibrate_batches"], cfg["calibrate_lengths"][-1])
    write_rates(path, rates, stats, rows, table)
    print(f"servers: {stats['samples']} bursts ({stats['dropped']} outliers dropped; fit mean rel. error "
          f"{stats['mean_rel_error']:.0%}, max {stats['max_rel_error']:.0%})")
    for row in table:
        print(f"  batch {row['batch']}: prefill {row['prefill_tokens_per_s']} tok/s, "
              f"decode {row['decode_tokens_per_s']} tok/s per worker")
    return rates


def calibrate_client(rates: Rates, spec: ModelSpec, shape: Shape, runs: Sequence[tuple[str, float, float, list[Any]]],
                     cfg: dict[str, Any]) -> tuple[Rates, list[int]]:
    """Scripted episodes on a calibration document (a size not validated on) give the subagents'
    output lengths, and the engine's own cost per request on top of the servers' (retry wrapper,
    reply parsing, observation building, on the same cores), added to `overhead_s` so that the
    calibration episodes are predicted exactly (the median over runs)."""
    calls = [c for *_, trajectories in runs for t in trajectories for turn in t.turns for q in turn.queries for c in q.calls]
    outputs = [max(c.completion_tokens, 1) for c in calls]
    extras, step = [], 1e-3
    for prefix, measured, _, _ in runs:
        workload = workload_for(shape, outputs, cfg, 1, 1, prefix)
        base = simulate_parser(workload, cluster_for(rates, spec, cfg)).latency_s
        slower = cluster_for(dataclasses.replace(rates, overhead_s=rates.overhead_s + step), spec, cfg)
        extras.append((measured - base) / ((simulate_parser(workload, slower).latency_s - base) / step))
    extra = max(statistics.median(extras), -rates.overhead_s)
    print(f"client: calibration episodes ({shape.chunks} chunks) {', '.join(f'{r[1]:.2f}' for r in runs)}s -> "
          f"{extra * 1e3:+.1f} ms per request on top of the servers' rates; subagent outputs mean "
          f"{statistics.mean(outputs):.1f} tokens")
    return dataclasses.replace(rates, overhead_s=rates.overhead_s + extra,
                               source=rates.source + f"; + {extra * 1e3:.1f} ms/request engine overhead"), outputs


async def validate(cfg: dict[str, Any], out_dir: Path) -> list[dict[str, Any]]:
    from parser.serving.backends import load_model_and_tokenizer, load_tokenizer

    tokenizer = load_tokenizer(cfg["model"])
    model, _ = load_model_and_tokenizer(cfg["model"])
    # the CPU backend holds transformers' cache: model dtype, the whole conv kernel per sequence
    spec = ModelSpec.from_hf_config(model.config.to_dict(), name=cfg["model"], dtype=str(model.dtype),
                                    conv_positions=getattr(model.config, "linear_conv_kernel_dim", None))
    del model
    config = EpisodeConfig(max_turns=cfg["rounds"] + 1, chunk_size=cfg["chunk_size"],
                           subagent_max_tokens=cfg["subagent_max_tokens"], lead_thinking=False)
    results = []
    with LocalWorkers(cfg["model"], cfg["workers"], cfg["threads_per_worker"], out_dir / "workers") as workers:
        calibrator = Calibrator(workers.urls, tokenizer, seed=cfg["seed"])
        pool = WorkerPool([HttpBackend(url, api="sglang", timeout_s=600) for url in workers.urls])
        reader = SubagentReader(pool, tokenizer, max_new_tokens=cfg["subagent_max_tokens"])
        make_engine = functools.partial(scripted_engine, reader, tokenizer, config, cfg["rounds"])
        calibration_shape, calibration_chunks = measure_shape(
            reader, tokenizer, document(cfg["calibration_paragraphs"], seed=99), cfg["chunk_size"])
        try:
            for i, (paragraphs, concurrency) in enumerate(cfg["workloads"]):
                print(f"== workload {i}: {paragraphs} paragraphs, concurrency {concurrency}")
                rates = await calibrate_servers(calibrator, cfg, out_dir / f"rates_w{i}.yaml")
                shape, chunks = measure_shape(reader, tokenizer, document(paragraphs, seed=i), cfg["chunk_size"])
                samples = cfg["samples_per_workload"] * concurrency
                # calibration episodes interleaved with the workload's runs, so both see the same
                # machine load; nothing measured on the workload enters its prediction
                calibration_runs, runs = [], []
                for r in range(cfg["runs_per_workload"]):
                    calibration_runs.append(await cold_run(make_engine, calibration_chunks, 1, 1, f"cal{i}-{r}-"))
                    runs.append(await cold_run(make_engine, chunks, samples, concurrency, f"w{i}-{r}-"))
                rates, outputs = calibrate_client(rates, spec, calibration_shape, calibration_runs, cfg)
                # each run is predicted for its own document ids (they decide the workers' loads)
                predicted = [simulate_parser(workload_for(shape, outputs, cfg, concurrency, samples, prefix),
                                             cluster_for(rates, spec, cfg)) for prefix, *_ in runs]
                calls = [c for t in runs[-1][3] for turn in t.turns for q in turn.queries for c in q.calls]
                latency = statistics.median(r[1] for r in runs)
                result = {
                    "paragraphs": paragraphs, "chunks": shape.chunks, "prefix_tokens": shape.prefix_tokens,
                    "concurrency": concurrency, "samples": samples, "runs": len(runs),
                    "predicted_latency_s": statistics.median(p.latency_s for p in predicted),
                    "measured_latency_s": latency,
                    "predicted_amortized_s": statistics.median(p.amortized_s for p in predicted),
                    "measured_amortized_s": statistics.median(r[2] for r in runs),
                    "measured_latency_runs_s": [r[1] for r in runs],
                    "predicted_hit_rate": predicted[-1].hit_rate,
                    "measured_hit_rate": sum(c.cached_tokens > 0 for c in calls) / max(len(calls), 1),
                    "failed_calls": sum(c.status == "failed" for c in calls),
                }
                results.append(result)
                print(f"  T={shape.chunks}: predicted {result['predicted_latency_s']:.2f}s, measured {latency:.2f}s "
                      f"(runs: {', '.join(f'{r[1]:.2f}' for r in runs)})", flush=True)
        finally:
            await pool.aclose()
            await calibrator.aclose()
    return results


def report(results: Sequence[dict[str, Any]]) -> tuple[str, float]:
    """The predicted-vs-measured table and the max relative error over per-episode latency and
    amortized time per sample."""
    lines = ["| doc (paragraphs) | chunks T | concurrency | latency pred / meas (s) | err | amortized pred / meas (s) "
             "| err | prefix hits pred / meas |", "|---|---|---|---|---|---|---|---|"]
    worst = 0.0
    for r in results:
        row = []
        for kind in ("latency", "amortized"):
            pred, meas = r[f"predicted_{kind}_s"], r[f"measured_{kind}_s"]
            worst = max(worst, abs(pred - meas) / meas)
            row.append(f"{pred:.2f} / {meas:.2f} | {abs(pred - meas) / meas:.0%}")
        lines.append(f"| {r['paragraphs']} | {r['chunks']} | {r['concurrency']} | {row[0]} | {row[1]} | "
                     f"{r['predicted_hit_rate']:.0%} / {r['measured_hit_rate']:.0%} |")
    return "\n".join(lines), worst


def main(cfg: dict[str, Any], out_dir: Path, paper: dict[str, Any] | None = None) -> float:
    if paper is not None:
        from parser.plan import table2

        print("== the paper: fitted on Table 2's short lengths, predicting the long ones")
        table2.main(paper, out_dir / "table2")
        print("== this machine: calibrate, predict, run")
    if cfg.get("smoke"):
        cfg = {**cfg, **cfg["smoke_overrides"]}
    results = asyncio.run(validate(cfg, out_dir))
    table, worst = report(results)
    summary = f"max relative error {math.ceil(worst * 100)}%"
    (out_dir / "validate.md").write_text(table + "\n\n" + summary + "\n", encoding="utf-8")
    print(table)
    print(summary)
    return worst
