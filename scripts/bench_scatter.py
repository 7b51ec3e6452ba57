"""Scatter throughput of the HTTP client: HttpBackend vs a bare aiohttp loop.

One scatter round sends the same query to every chunk of an 896K-token document at once:
T = 220 requests at chunk size 4096 (inference) and T = 1750 at chunk size 512 (training),
the paper's inference and training chunk sizes.
The workers are zero-compute loopback processes (`parser/serving/loopback.py`), so what is
measured is the client: requests/s of `HttpBackend` and of the least code that can do the
same with aiohttp (same bytes on the wire, routing headers included), in the same run, their
ratio (target >= 0.8), and the client's CPU time per round (`time.process_time`); on a busy
machine wall-clock rates swing, and the CPU-time ratio (bare / HttpBackend) is the steadier
measure of the client's own overhead. Prompts are the real subagent template (instructions ->
chunk -> query) wrapped in a Qwen chat template, with chunks of ~4 characters per token.

    .venv/bin/python scripts/bench_scatter.py        # 15 s on 2 idle cores, ~60 s on busy ones
    .venv/bin/python scripts/bench_scatter.py --workers 4 --rounds 5 --api completions
    .venv/bin/python scripts/bench_scatter.py --smoke    # seconds (the suite runs it)
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import time

import aiohttp
import orjson

from parser.engine import prompts
from parser.serving.types import ROUTING_HEADER, SamplingParams
from parser.serving.backends.http import HttpBackend
from parser.serving.wire.dialect import DIALECTS
from parser.text.chat_format import CHATML

CHARS_PER_TOKEN = 4
QUERY = "Which city did the author of the report move to after the flood?"
SAMPLING = SamplingParams(max_new_tokens=512, temperature=0.7)


# ---------------------------------------------------------------------- setup
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_workers(n: int) -> tuple[list[subprocess.Popen], list[str]]:
    procs, urls = [], []
    for i in range(n):
        port = free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "parser.serving.loopback", "--port", str(port),
             "--worker-id", f"w{i}", "--no-records"], stdout=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{port}")
    return procs, urls


async def wait_healthy(urls: list[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        for url in urls:
            while True:
                try:
                    async with session.get(url + "/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"loopback worker at {url} did not come up")
                await asyncio.sleep(0.2)


def subagent_prompts(num_chunks: int, chunk_tokens: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    vocab = [w for w in ("the river report city flood author moved north council archive "
                         "harbour mayor winter bridge station records letter family market "
                         "school").split()]
    out = []
    for _ in range(num_chunks):
        words, size = [], 0
        while size < chunk_tokens * CHARS_PER_TOKEN:
            w = rng.choice(vocab)
            words.append(w)
            size += len(w) + 1
        content = prompts.render("subagent", chunk=" ".join(words), query=QUERY)
        # what SubagentReader sends: the Qwen chat template, non-thinking
        out.append(f"{CHATML.turn_start}user\n{content}{CHATML.end_of_turn}\n{CHATML.turn_start}assistant\n"
                   "<think>\n\n</think>\n\n")
    return out


# ---------------------------------------------------------------------- the two clients
async def round_backend(backends: list[HttpBackend], texts: list[str]) -> int:
    n = len(backends)
    outs = await asyncio.gather(*(
        backends[i % n].generate(t, SAMPLING, routing_key=f"doc0:{i}", request_id="bench")
        for i, t in enumerate(texts)))
    return sum(1 for o in outs if o.text)


async def round_bare(session: aiohttp.ClientSession, urls: list[str], texts: list[str],
                     api: str) -> int:
    path = DIALECTS[api].path  # the body below is hand-written on purpose: the least code on the wire

    async def one(i: int, text: str) -> int:
        if api == "sglang":
            body = {"text": text, "sampling_params": {"max_new_tokens": 512, "temperature": 0.7}}
        else:
            body = {"model": "default", "prompt": text, "max_tokens": 512, "temperature": 0.7}
        headers = {"Content-Type": "application/json", ROUTING_HEADER: f"doc0:{i}",
                   "X-Request-Id": "bench"}  # the same bytes on the wire as HttpBackend
        async with session.post(urls[i % len(urls)] + path, data=orjson.dumps(body),
                                headers=headers) as r:
            out = orjson.loads(await r.read())
        return 1 if out else 0

    return sum(await asyncio.gather(*(one(i, t) for i, t in enumerate(texts))))


async def measure(fn, *args) -> tuple[int, float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    answered = await fn(*args)
    return answered, time.perf_counter() - t0, time.process_time() - c0


# ---------------------------------------------------------------------- main
async def bench(urls: list[str], scatters: list[tuple[int, int]], rounds: int, api: str) -> None:
    backends = [HttpBackend(u, api=api) for u in urls]
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                    timeout=aiohttp.ClientTimeout(total=600))
    print(f"api={api} workers={len(urls)} rounds={rounds} (median reported)")
    print(f"{'chunk':>6} {'T':>5} {'MB/round':>8} | {'bare req/s':>10} {'cpu s':>6} | "
          f"{'Http req/s':>10} {'cpu s':>6} | ratio cpu ratio")
    try:
        for T, chunk in scatters:
            texts = subagent_prompts(T, chunk)
            mb = sum(len(t) for t in texts) / 1e6
            await round_bare(session, urls, texts, api)  # warm-up: open the connections
            await round_backend(backends, texts)
            bare, http = [], []
            for r in range(rounds):  # alternate the order so neither always goes second
                pair = [("bare", round_bare, (session, urls, texts, api)),
                        ("http", round_backend, (backends, texts))]
                for name, fn, args in (pair if r % 2 == 0 else pair[::-1]):
                    answered, wall, cpu = await measure(fn, *args)
                    if answered != T:
                        raise RuntimeError(f"{name}: {answered} of {T} requests answered")
                    (bare if name == "bare" else http).append((wall, cpu))
            b_wall, h_wall = (statistics.median(w for w, _ in x) for x in (bare, http))
            b_cpu, h_cpu = (statistics.median(c for _, c in x) for x in (bare, http))
            print(f"{chunk:>6} {T:>5} {mb:>8.1f} | {T / b_wall:>10.0f} {b_cpu:>6.2f} | "
                  f"{T / h_wall:>10.0f} {h_cpu:>6.2f} | {b_wall / h_wall:>5.2f} {b_cpu / h_cpu:>9.2f}")
    finally:
        await session.close()
        for b in backends:
            await b.aclose()


def scatter_spec(text: str) -> tuple[int, int]:
    try:
        T, chunk = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--scatter {text!r}: expected T:chunk_tokens, e.g. 220:4096")
    return T, chunk


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="loopback worker processes")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per client and size")
    ap.add_argument("--scatter", nargs="+", type=scatter_spec, default=[(220, 4096), (1750, 512)],
                    help="rounds to run, as T:chunk_tokens (default 220:4096 1750:512)")
    ap.add_argument("--api", choices=["sglang", "completions"], default="sglang")
    ap.add_argument("--smoke", action="store_true", help="1 worker, 2 rounds of 32 chunks: seconds (the suite runs it)")
    args = ap.parse_args()
    if args.smoke:
        args.workers, args.rounds, args.scatter = 1, 2, [(32, 512)]

    procs, urls = start_workers(args.workers)
    try:
        asyncio.run(wait_healthy(urls))
        asyncio.run(bench(urls, args.scatter, args.rounds, args.api))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
