"""How fast `chunk_document` packs a paper-scale document, against tokenizing it bare.

    .venv/bin/python scripts/bench_chunking.py            # 6,400 paragraphs (~900K tokens)
    .venv/bin/python scripts/bench_chunking.py --smoke    # seconds (the suite runs it)

Target (issue: "an 896K-token document must chunk in about a second with a fast tokenizer"):
chunking costs little more than one batched tokenization of the same text. The baseline is the
tokenizer alone on the whole paragraph list in one batch call, measured in the same run; the
ratio chunking / baseline should stay near 1.
"""
from __future__ import annotations

import argparse
import statistics
import time

from parser.text.chunking import chunk_document, render_paragraphs
from parser.offline import qwen3_tokenizer


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times), statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--paragraphs", type=int, default=6400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="200 paragraphs, 1 repeat: seconds (the suite runs it)")
    args = ap.parse_args()
    if args.smoke:
        args.paragraphs, args.repeats = 200, 1

    tokenizer = qwen3_tokenizer()
    paragraphs = [f"Title {i}\n" + f"Paragraph {i} tells how entity {i * 7} met entity {i * 13} in year {1800 + i % 200}. " * 4
                  for i in range(args.paragraphs)]
    document = render_paragraphs(paragraphs)
    tokens = sum(len(e.ids) for e in tokenizer.backend_tokenizer.encode_batch(paragraphs, add_special_tokens=False))
    print(f"document: {args.paragraphs} paragraphs, {tokens:,} tokens, {len(document) / 1e6:.1f} MB")

    bare = best_of(lambda: tokenizer.backend_tokenizer.encode_batch(paragraphs, add_special_tokens=False), args.repeats)
    for chunk_size in (4096, 512):
        result = {}
        timing = best_of(lambda: result.setdefault("chunks", chunk_document(document, tokenizer, chunk_size)), args.repeats)
        print(f"chunk {chunk_size:>4}: {len(result['chunks']):>5} chunks  best {timing[0]:.2f}s (median {timing[1]:.2f}s)  "
              f"bare tokenization best {bare[0]:.2f}s  ratio {timing[0] / bare[0]:.2f}  "
              f"({tokens / timing[0] / 1e6:.2f}M tokens/s)")


if __name__ == "__main__":
    main()
