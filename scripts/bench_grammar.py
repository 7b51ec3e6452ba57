"""A lead turn's constraint overhead under `distinct_queries`: a grammar compiled every turn (the
full regex, what the in-process backend did before) against the base grammar compiled once and
the exclusion applied per step (`SamplingParams.exclusion`, `grammar.ExcludingMatcher`).

One episode of `--turns` lead turns on the real Qwen3 tokenizer (151K tokens), the queries asked
so far excluded each turn; per turn: building the matcher (the compile, or the cache hit) and
masking + accepting the tokens of one constrained tool call (what the backend does per decode
step, less the model). Both paths run in the same process on the same turns, and the ratio is
printed per turn and over the episode. Figures are wall-clock on whatever the machine is doing.

    .venv/bin/python scripts/bench_grammar.py               # Qwen3 vocabulary, 6 turns (~a minute)
    .venv/bin/python scripts/bench_grammar.py --turns 10
    .venv/bin/python scripts/bench_grammar.py --smoke       # the tiny tokenizer, 3 turns (the suite runs it)
"""
from __future__ import annotations

import argparse
import math
import time

import torch

from parser.serving.backends.grammar import Grammars
from parser.text.actions import action_constraint

TOOLS = [{"type": "function", "function": {"name": "query_agents", "description": "ask every chunk",
                                           "parameters": {"properties": {"query": {"type": "string"}}}}}]
QUERIES = ["Who directed Film X?", "When was the director of Film X born?", "Where was Film X shot?",
           "Which studio produced Film X?", "Who wrote the score of Film X?", "What prize did Film X win?",
           "Who starred in Film X?", "In which year was Film X released?", "Who edited Film X?",
           "What is Film X based on?"]


def turn(grammars: Grammars, tokenizer, asked: list[str], compile_once: bool) -> tuple[float, float]:
    """(seconds to build the turn's matcher, seconds to mask and accept one call's tokens)."""
    regex, exclusion = action_constraint(TOOLS, "json", thinking=True, exclude=asked)
    started = time.perf_counter()
    matcher = grammars.matcher(("regex", regex), exclusion if compile_once else None)
    built = time.perf_counter()
    call = 'plan</think>\n\n<tool_call>{"name": "query_agents", "arguments": {"query": "%s"}}</tool_call>'
    logits = torch.zeros(grammars.info.vocab_size)
    for token in tokenizer.encode(call % QUERIES[len(asked)], add_special_tokens=False):
        matcher.mask(logits)
        matcher.accept(token)
    return built - started, time.perf_counter() - built


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=6, help=f"lead turns per episode (at most {len(QUERIES)})")
    ap.add_argument("--smoke", action="store_true", help="the tiny tokenizer, 3 turns: seconds (keeps this from rotting)")
    args = ap.parse_args()
    from parser.offline import byte_bpe_tokenizer, qwen3_tokenizer

    tokenizer = byte_bpe_tokenizer() if args.smoke else qwen3_tokenizer()
    turns = 3 if args.smoke else min(args.turns, len(QUERIES))
    stop = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    print(f"vocabulary: {len(tokenizer)} tokens; {turns} lead turns, queries so far excluded\n")
    print(f"{'turn':>4} {'excluded':>8} | {'compile every turn':>22} | {'compiled once':>22} | ratio")
    totals = {False: 0.0, True: 0.0}
    # each path on a fresh compiler: neither reuses what the other compiled
    paths = {once: Grammars(tokenizer, len(tokenizer), stop) for once in (False, True)}
    for index in range(turns):
        cells, seconds = [], {}
        for once in (False, True):
            build, steps = turn(paths[once], tokenizer, QUERIES[:index], once)
            seconds[once] = build + steps
            totals[once] += build + steps
            cells.append(f"{build:8.3f} s + {steps:6.3f} s")
        ratio = seconds[False] / seconds[True]
        print(f"{index + 1:>4} {index:>8} | {cells[0]:>22} | {cells[1]:>22} | {ratio:6.1f}x")
    ratio = totals[False] / totals[True]
    print(f"\nepisode: compile every turn {totals[False]:.2f} s, compiled once {totals[True]:.2f} s, "
          f"ratio {ratio:.1f}x (build + per-step masking, no model)")
    if not (math.isfinite(ratio) and ratio > 0 and totals[True] > 0):
        raise SystemExit(f"bench_grammar: nonsense figures {totals}")


if __name__ == "__main__":
    main()
