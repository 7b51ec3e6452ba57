"""Is the subagent gateway healthy? Send a ParSer-shaped workload and print per-round figures.

The workload is what ParSer does to a gateway: T chunks of one document, K rounds; in each round
one new query goes to every chunk at once, as the subagent prompt (instructions -> chunk ->
query), with the routing key `doc_id:chunk_index`. Per round it prints:

- req/s           requests per second of the round's wall time (client + gateway + workers)
- locality        share of round-2+ requests answered by the worker that served their chunk in
                  round 1 (needs `X-Worker-Id` answers: parser.serving.server and the loopback worker send
                  it; for SGLang workers it is estimated from cached tokens, marked "~")
- spread          max/mean requests per worker in the round (1.0 = perfectly even); from worker
                  ids, or from each worker's Prometheus `sglang:num_requests_total` counter
- cached          cached-token share of the round's prompt tokens (SGLang `meta_info.cached_tokens`)
                  next to the share a perfect prefix cache would give ("ideal"): on SGLang workers
                  round 2+ should be close to ideal — that is the proof that prefix reuse works,
                  including the mamba state of Qwen3.5's hybrid layers (`extra_buffer`).
- failed/retries  requests that failed every attempt / extra attempts spent on 5xx or dropped
                  connections (the client retries, as the episode engine does)
- p50/p99         per-request latency (the answered attempt). With `--direct` every round is also
                  sent straight to the workers (the client-side `WorkerPool`, same pinning), right
                  after the gateway's, and the summary gives the router's added latency: gateway
                  minus direct at p50 and p99, over rounds 2+ (both paths warm).

Healthy: locality >= 0.99, spread <= 1.5, cached ~= ideal on rounds 2+, failed = 0.

    # a gateway started by parser/cli/gateway.py (its URL is printed there)
    python scripts/gateway_report.py --gateway http://127.0.0.1:30000 \
        --workers http://127.0.0.1:30001 http://127.0.0.1:30002 --chunks 64 --rounds 4
    # what the router adds to each request: the same rounds straight to the workers, interleaved
    # (--concurrency 1: one request at a time, the figure configs/plan/router/ takes)
    python scripts/gateway_report.py --gateway http://127.0.0.1:30000 \
        --workers http://127.0.0.1:30001 http://127.0.0.1:30002 --direct --concurrency 1
    # real chat-rendered prompts (what SubagentReader sends), from a local tokenizer
    python scripts/gateway_report.py --gateway ... --tokenizer /models/Qwen3.5-4B --chunk-words 3000

`--json out.json` also writes the figures; `--router-file` (with `--direct`) writes the added
latency as the planner's router input (configs/plan/router/), its source named. Everything here
is a client: it starts nothing.

    python scripts/gateway_report.py --gateway ... --workers ... --direct --concurrency 1 \
        --router-file configs/plan/router/smg.yaml --router-label "smg 1.13.0 over 3 loopback workers"
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import math
import os
import random
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence



from parser.base.redact import redact
from parser.engine import prompts
from parser.serving.types import ROUTING_HEADER, Backend, SamplingParams
from parser.serving.retry import retrying

_WORDS = ("river castle amber signal harbor lantern meadow copper orbit violet canyon ledger "
          "summit willow ember quartz falcon thistle marble cobalt tundra saffron beacon "
          "glacier pepper juniper anchor velvet cedar").split()


# ---------------------------------------------------------------------------- workload
@dataclasses.dataclass
class Workload:
    chunks: int = 32  # T: one request per chunk per round
    rounds: int = 4  # K
    chunk_words: int = 400  # ~1.3 tokens a word: 400 words ~ a 512-token chunk
    doc_id: str = "gateway-report"
    max_new_tokens: int = 32  # the report measures routing, not decoding; subagents use 512
    temperature: float = 0.7
    seed: int = 0

    def chunk_texts(self) -> list[str]:
        rng = random.Random(self.seed)
        return [f"Document {i + 1}:\n" + " ".join(rng.choice(_WORDS) for _ in range(self.chunk_words))
                for i in range(self.chunks)]

    def query(self, round_index: int) -> str:
        return f"Round {round_index}: which {_WORDS[round_index % len(_WORDS)]} is mentioned first?"


def subagent_prompts(workload: Workload, round_index: int, render: Callable[[str], str] | None = None) -> list[str]:
    """The round's prompts in SubagentReader's order (instructions -> chunk -> query)."""
    query = workload.query(round_index)
    texts = [prompts.render("subagent", chunk=chunk, query=query) for chunk in workload.chunk_texts()]
    return [render(t) if render else t for t in texts]


def prefix_share(prompt: str, query: str) -> float:
    """Share of a prompt's characters before its query: what a prefix cache can reuse."""
    cut = prompt.rfind(query)
    return cut / len(prompt) if cut > 0 else 0.0


def instruction_share(workload: Workload, render: Callable[[str], str] | None = None) -> float:
    """Share of a typical prompt's text taken by the fixed instructions (same for every chunk).

    cache_aware compares the matched prefix against the whole text: if this share exceeds
    `--cache-threshold`, every chunk "matches" the first worker's tree and lands there.
    """
    chunk = workload.chunk_texts()[0]
    prompt = subagent_prompts(Workload(**{**dataclasses.asdict(workload), "chunks": 1}), 0, render)[0]
    return prompt.index(chunk) / len(prompt)


# ---------------------------------------------------------------------------- measurement
@dataclasses.dataclass
class RoundStats:
    round: int
    requests: int
    failed: int
    retries: int
    wall_s: float
    per_worker: dict[str, int]
    num_workers: int = 0  # workers behind the gateway (idle ones count in the spread)
    locality: float | None = None  # share of requests on their round-1 worker (round 2+)
    locality_estimated: bool = False  # True: from cached tokens, not worker ids
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ideal_cached_share: float = 0.0
    path: str = "gateway"  # or "direct": the same round sent straight to the workers
    latencies_s: list[float] = dataclasses.field(default_factory=list, repr=False)  # answered attempts

    @property
    def rps(self) -> float:
        return self.requests / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def spread(self) -> float | None:
        counts = list(self.per_worker.values())
        if not counts or sum(counts) == 0:
            return None
        return max(counts) / (sum(counts) / max(len(counts), self.num_workers))

    @property
    def cached_share(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def line(self) -> str:
        loc = "   -  " if self.locality is None else f"{'~' if self.locality_estimated else ' '}{self.locality:5.3f}"
        spread = "  -  " if self.spread is None else f"{self.spread:5.2f}"
        cached = "   -  " if self.cached_share is None else f"{self.cached_share:6.3f}"
        workers = " ".join(f"{w}={n}" for w, n in sorted(self.per_worker.items()))
        p50, p99 = (f"{x * 1e3:6.1f}" if x is not None else "   -  " for x in percentiles(self.latencies_s))
        tag = "" if self.path == "gateway" else f" {self.path}"
        return (f"round {self.round}{tag}: {self.requests:5d} req {self.rps:8.1f} req/s  locality {loc}  "
                f"spread {spread}  cached {cached} (ideal {self.ideal_cached_share:.3f})  "
                f"p50/p99 {p50}/{p99} ms  failed {self.failed} retries {self.retries}  [{workers}]")

    def to_dict(self) -> dict[str, Any]:
        out = {**dataclasses.asdict(self), "rps": self.rps, "spread": self.spread, "cached_share": self.cached_share}
        out.pop("latencies_s")
        out["p50_s"], out["p99_s"] = percentiles(self.latencies_s)
        return out


def percentiles(values: Sequence[float], qs: Sequence[float] = (0.5, 0.99)) -> list[float | None]:
    """Nearest-rank percentiles (None for no values)."""
    ordered = sorted(values)
    if not ordered:
        return [None for _ in qs]
    return [ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] for q in qs]


def scrape_counter(worker_url: str, name: str = "sglang:num_requests_total") -> float | None:
    """Sum of one Prometheus counter over its label sets on `worker_url/metrics` (None if absent)."""
    try:
        with urllib.request.urlopen(worker_url.rstrip("/") + "/metrics", timeout=5) as resp:
            text = resp.read().decode(errors="replace")
    except OSError:
        return None
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})?\s+([0-9.eE+-]+)$", re.MULTILINE)
    values = [float(v) for v in pattern.findall(text)]
    return sum(values) if values else None


async def run_workload(
    backend: Backend,
    workload: Workload,
    *,
    render: Callable[[str], str] | None = None,
    worker_urls: Sequence[str] = (),
    max_attempts: int = 4,
    retry_backoff_s: float = 0.5,
    concurrency: int = 4096,
    during_round: Callable[[int], Awaitable[None]] | None = None,
    num_workers: int | None = None,
    direct: Backend | None = None,
) -> list[RoundStats]:
    """Send `workload` through `backend` (normally an HttpBackend on the gateway).

    `during_round(r)` runs concurrently with round r's requests (tests kill a worker there).
    `num_workers` (or `worker_urls`) makes idle workers count in the spread. `direct` (a
    backend straight to the workers) gets every round too, right after the gateway's; its rows
    have `path="direct"`. Retries retryable failures like the episode engine (exponential
    backoff with jitter).
    """
    sampling = SamplingParams(max_new_tokens=workload.max_new_tokens, temperature=workload.temperature)
    slots = asyncio.Semaphore(concurrency)
    homes: dict[str, dict[int, str]] = {}  # path -> chunk -> worker that served it in round 1
    stats: list[RoundStats] = []
    paths = [("gateway", backend)] + ([("direct", direct)] if direct is not None else [])
    for r in range(workload.rounds):
        round_prompts = subagent_prompts(workload, r, render)
        ideal = sum(prefix_share(p, workload.query(r)) for p in round_prompts) / len(round_prompts)
        for path, target in paths:
            row, ok = await _round(target, round_prompts, sampling, workload, r, slots, max_attempts, retry_backoff_s,
                               worker_urls if path == "gateway" else (),
                               during_round if path == "gateway" else None)
            row.path, row.ideal_cached_share = path, ideal
            row.num_workers = max(len(worker_urls), num_workers or 0, len(row.per_worker))
            home = homes.setdefault(path, {})
            if r == 0:
                home.update({i: c.worker for i, c in ok if c.worker})
            elif ok:
                if home:
                    row.locality = sum(home.get(i) == c.worker for i, c in ok) / len(ok)
                elif any(c.cached_tokens for _, c in ok):
                    # no worker ids: a request "hit" if most of its reusable prefix came from cache
                    row.locality = sum(c.cached_tokens >= 0.9 * ideal * c.prompt_tokens for _, c in ok) / len(ok)
                    row.locality_estimated = True
            stats.append(row)
    return stats


async def _round(backend: Backend, round_prompts: Sequence[str], sampling: SamplingParams, workload: Workload,
                 r: int, slots: asyncio.Semaphore, max_attempts: int, retry_backoff_s: float,
                 worker_urls: Sequence[str], during_round: Callable[[int], Awaitable[None]] | None
                 ) -> tuple[RoundStats, list[tuple[int, Any]]]:
    """One scatter round through `backend` -> its stats and the (chunk, completion) pairs answered."""
    attempts = collections.Counter()
    latencies: list[float] = []

    async def one(i: int, prompt: str) -> tuple[int, Any]:
        try:
            async for attempt in retrying(max_attempts, retry_backoff_s, max_backoff_s=10.0):
                with attempt:
                    attempts[i] += 1
                    async with slots:
                        sent = time.perf_counter()
                        completion = await backend.generate(prompt, sampling, routing_key=f"{workload.doc_id}:{i}")
                        latencies.append(time.perf_counter() - sent)
                        return i, completion
        except Exception as error:  # noqa: BLE001 - a failed request is counted, not raised
            return i, error
        raise AssertionError("unreachable")

    before = {u: scrape_counter(u) for u in worker_urls}
    started = time.perf_counter()
    tasks = [one(i, p) for i, p in enumerate(round_prompts)]
    if during_round is not None:
        results, _ = await asyncio.gather(asyncio.gather(*tasks), during_round(r))
    else:
        results = await asyncio.gather(*tasks)
    wall = time.perf_counter() - started
    after = {u: scrape_counter(u) for u in worker_urls}

    ok = [(i, c) for i, c in results if not isinstance(c, BaseException)]
    per_worker: dict[str, int] = collections.Counter(c.worker for _, c in ok if c.worker)
    if not per_worker and worker_urls and all(before[u] is not None and after[u] is not None for u in worker_urls):
        per_worker = {redact(u): int(after[u] - before[u]) for u in worker_urls}  # printed and written
    row = RoundStats(
        round=r + 1, requests=len(results), failed=len(results) - len(ok),
        retries=sum(attempts.values()) - len(results), wall_s=wall, per_worker=dict(per_worker),
        prompt_tokens=sum(c.prompt_tokens for _, c in ok), cached_tokens=sum(c.cached_tokens for _, c in ok),
        latencies_s=latencies,
    )
    return row, ok


def summary(stats: Sequence[RoundStats]) -> dict[str, Any]:
    """Rounds 2+ pooled: the figures the README calls healthy or not (and, with direct rows,
    the router's added latency at p50 and p99)."""
    gateway = [s for s in stats if s.path == "gateway"]
    later = [s for s in gateway if s.round >= 2]
    measured = [s for s in later if s.locality is not None]
    spreads = [s.spread for s in gateway if s.spread is not None]
    prompt = sum(s.prompt_tokens for s in later)
    p50, p99 = percentiles([x for s in later for x in s.latencies_s])
    out = {
        "rounds": len(gateway),
        "requests": sum(s.requests for s in gateway),
        "failed": sum(s.failed for s in gateway),
        "retries": sum(s.retries for s in gateway),
        "locality_round2plus": (sum(s.locality * s.requests for s in measured) / sum(s.requests for s in measured))
        if measured else None,
        "max_spread": max(spreads) if spreads else None,
        "cached_share_round2plus": sum(s.cached_tokens for s in later) / prompt if prompt else None,
        "ideal_cached_share": later[0].ideal_cached_share if later else None,
        "p50_ms": None if p50 is None else p50 * 1e3,
        "p99_ms": None if p99 is None else p99 * 1e3,
    }
    direct = [s for s in stats if s.path == "direct" and s.round >= 2]
    if direct:
        d50, d99 = percentiles([x for s in direct for x in s.latencies_s])
        out.update({"direct_failed": sum(s.failed for s in direct),
                    "direct_p50_ms": None if d50 is None else d50 * 1e3,
                    "direct_p99_ms": None if d99 is None else d99 * 1e3,
                    "added_p50_ms": None if None in (p50, d50) else (p50 - d50) * 1e3,
                    "added_p99_ms": None if None in (p99, d99) else (p99 - d99) * 1e3})
    return out


def write_router_file(path: Path, total: dict[str, Any], args: argparse.Namespace, workload: Workload) -> None:
    """The planner's router input (parser.plan.planner.load_router): p50 added latency, and where it came from."""
    import datetime

    import yaml

    added = total.get("added_p50_ms")
    if added is None or not math.isfinite(added):
        raise SystemExit(f"{path}: no added latency measured (summary {total})")
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    source = (f"{args.router_label or args.gateway}: scripts/gateway_report.py --direct --concurrency {args.concurrency}, "
              f"{workload.chunks} chunks x {workload.rounds - 1} rounds (2+) per path, interleaved; p50 gateway "
              f"{total['p50_ms']:.2f} ms vs direct {total['direct_p50_ms']:.2f} ms (p99 added {total['added_p99_ms']:+.2f} ms); "
              f"load average {load} on {os.cpu_count()} cores; {datetime.date.today().isoformat()}")
    body = {"added_latency_s": round(max(added, 0.0) / 1e3, 6), "added_latency_p99_s": round(total["added_p99_ms"] / 1e3, 6),
            "source": source}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Written by scripts/gateway_report.py --router-file (the command in `source`): regenerate, do not edit.\n"
                    + yaml.safe_dump(body, sort_keys=False, width=110))
    print(f"wrote {path}")


# ---------------------------------------------------------------------------- CLI
def _load_render(tokenizer_path: str | None) -> Callable[[str], str] | None:
    if not tokenizer_path:
        return None
    from transformers import AutoTokenizer

    from parser.engine.readers.subagent import render_chat

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    return lambda text: render_chat(tok, [{"role": "user", "content": text}], enable_thinking=False)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # -- where
    ap.add_argument("--gateway", required=True, help="router URL, e.g. http://127.0.0.1:30000")
    ap.add_argument("--workers", nargs="*", default=[], help="worker URLs (for /metrics-based load spread)")
    ap.add_argument("--num-workers", type=int, default=None, help="workers behind the gateway, if not listed")
    ap.add_argument("--direct", action="store_true",
                    help="also send every round straight to --workers: the router's added latency")
    ap.add_argument("--api", default="sglang", choices=["sglang", "completions"], help="wire format")
    ap.add_argument("--routing-header", default=ROUTING_HEADER,
                    help="header for doc_id:chunk_index; X-SMG-Routing-Key for consistent_hashing/manual")
    # -- workload
    ap.add_argument("--chunks", type=int, default=32, help="T: chunks (requests per round)")
    ap.add_argument("--rounds", type=int, default=4, help="K: rounds (one query each)")
    ap.add_argument("--chunk-words", type=int, default=400, help="words per chunk (~1.3 tokens each)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--tokenizer", default=None, help="local tokenizer path: chat-render prompts like SubagentReader")
    ap.add_argument("--max-attempts", type=int, default=4, help="per request, for 5xx / dropped connections")
    ap.add_argument("--concurrency", type=int, default=4096,
                    help="requests in flight at once (1: the router's own per-request cost, without client queueing)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--router-file", default=None, help="with --direct: write the added latency for the planner here")
    ap.add_argument("--router-label", default="", help="what was measured (router, version, workers), for the file's source")
    args = ap.parse_args(argv)
    if args.direct and not args.workers:
        ap.error("--direct needs the worker URLs (--workers)")
    if args.router_file and not args.direct:
        ap.error("--router-file needs --direct (the added latency is gateway minus direct)")
    return args


def report(args: argparse.Namespace, stats: list[RoundStats], workload: Workload) -> None:
    """The per-round lines and the summary; the added latency and the files `--direct`,
    `--router-file` and `--json` ask for."""
    for s in stats:
        print(s.line())
    total = summary(stats)
    print("summary:", json.dumps(total))
    if args.direct:
        print(f"added by the gateway (rounds 2+): p50 {total['added_p50_ms']:+.2f} ms, p99 {total['added_p99_ms']:+.2f} ms "
              f"(gateway {total['p50_ms']:.2f}/{total['p99_ms']:.2f}, direct {total['direct_p50_ms']:.2f}/"
              f"{total['direct_p99_ms']:.2f} ms); load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.router_file:
        write_router_file(Path(args.router_file), total, args, workload)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": [s.to_dict() for s in stats],
                                               "summary": total}, indent=2))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from parser.serving.backends.http import HttpBackend
    from parser.serving.backends.pool import WorkerPool

    workload = Workload(chunks=args.chunks, rounds=args.rounds, chunk_words=args.chunk_words,
                        max_new_tokens=args.max_new_tokens)
    render = _load_render(args.tokenizer)

    async def go() -> list[RoundStats]:
        direct = WorkerPool([HttpBackend(u, api=args.api) for u in args.workers]) if args.direct else None
        try:
            async with HttpBackend(args.gateway, api=args.api, routing_header=args.routing_header) as backend:
                return await run_workload(backend, workload, render=render, worker_urls=args.workers,
                                          max_attempts=args.max_attempts, num_workers=args.num_workers,
                                          direct=direct, concurrency=args.concurrency)
        finally:
            if direct is not None:
                await direct.aclose()

    share = instruction_share(workload, render)
    print(f"gateway {redact(args.gateway)}: T={args.chunks} chunks x K={args.rounds} rounds, "
          f"instructions are {share:.1%} of a prompt's text"
          + ("  (above cache_aware's default 0.3 threshold: expect every chunk on one worker)" if share > 0.3 else ""))
    stats = asyncio.run(go())
    report(args, stats, workload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
