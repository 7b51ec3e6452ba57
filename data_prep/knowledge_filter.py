"""The parametric-knowledge filter: drop questions a model answers *without* the document.

A training question the policy can answer from memory teaches it nothing about reading. As in
MemAgent (``taskutils/memory_data/filter.py``) and the paper (Appendix C.1: Qwen3.5-9B,
non-thinking, Best-of-3), each question is asked with no context, k samples are drawn, and the
question is dropped if *any* sample is correct under MemAgent's two checks (`filter.py` `scores`
and `contains`, BytedTsinghua-SIA/MemAgent @ 76b7a65; `is_correct`): the boxed answer of the
reply's last 300 characters equals a gold under its math-string normaliser
(`hotpotqa_verifier.compute_score`, `parser.text.memagent_scoring.boxed_matches`), or a gold,
lowercased, occurs in the lowercased reply. One difference: a ``<think>`` block is not read
(their Qwen2.5 models never think; a thinking model's plan would otherwise count as an answer).

Runs through any `parser.serving.backends` Backend (SGLang over HTTP, sglang.Engine, transformers),
with asyncio concurrency; every request follows `parser.serving.retry` (timeouts and retryable server
errors retried; a question whose request still fails is not logged, so a re-run asks it again). Resumable: every finished question is appended to a JSONL log and
skipped on the next run, so an interrupted 41K-question job picks up where it stopped.

    log = asyncio.run(parametric_filter(questions, backend, tokenizer, log_path="filter.jsonl"))
    kept = [q for q in questions if not log[q["id"]]["answerable"]]
"""
from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path
from typing import Any, Sequence

from tqdm.auto import tqdm

from parser.records.jsonl import JsonlStore
from data_prep.packing import derived_seed
from parser.serving.types import Backend, SamplingParams
from parser.text.chat_format import CHATML
from parser.serving.retry import RetryPolicy
from parser.text.memagent_scoring import boxed_matches

# MemAgent's filter prompt: the bare question plus a boxed-answer instruction.
PROMPT_TEMPLATE = "{question}\nYour final answer in \\boxed{{}}.\n"  # its final newline too
DEFAULT_SAMPLING = SamplingParams(max_new_tokens=512, temperature=1.0, top_p=0.7)
_THINK = re.compile(r"<think>.*?(</think>|$)", re.S)
# 3 attempts, backoff 1 s doubling to at most 10 s, 10 minutes per 512-token sample.
DEFAULT_RETRY = RetryPolicy(max_attempts=3, backoff_s=1.0, timeout_s=600.0, max_backoff_s=10.0)


def is_correct(response: str, golds: Sequence[str]) -> bool:
    """MemAgent's verdict on one closed-book reply (`filter.py`: `max(compute_score(r, gt) for gt
    in gts)` or `max(gt.lower() in r.lower() for gt in gts)`), on the text outside `<think>` blocks.
    No normaliser beyond lowercasing: "Eiffel Tower." boxed does not match gold "Eiffel Tower"
    (math-string keeps the dot), and an empty gold is in every reply."""
    text = _THINK.sub("", response)
    lowered = text.lower()
    return any(boxed_matches(text, gold) or gold.lower() in lowered for gold in map(str, golds))


def render_prompt(tokenizer: Any, question: str, enable_thinking: bool = False) -> str:
    """The question alone, in the model's chat template (non-thinking mode by default). The question
    comes from a data set: it is shown as text, never as the template's control tokens."""
    messages = [{"role": "user", "content": PROMPT_TEMPLATE.format(question=CHATML.neutralize(question, tokenizer))}]
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking)
    except TypeError:  # templates that take no enable_thinking switch
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


async def parametric_filter(questions: Sequence[dict[str, Any]], backend: Backend, tokenizer: Any, *,
                            log_path: str | Path, samples: int = 3, sampling: SamplingParams = DEFAULT_SAMPLING,
                            concurrency: int = 64, seed: int = 0, enable_thinking: bool = False,
                            retry: RetryPolicy = DEFAULT_RETRY) -> dict[str, dict[str, Any]]:
    """Ask every question (``{id, question, answers}``) `samples` times without context.

    Returns ``{id: {"id", "responses", "correct", "answerable"}}`` for all questions, reading
    finished ones from `log_path` and appending new ones to it.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    log = JsonlStore(log_path, key=lambda row: str(row["id"]))
    todo = [q for q in questions if str(q["id"]) not in log]
    sem = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(questions), initial=len(questions) - len(todo), desc="knowledge filter", leave=False)

    async def one_sample(prompt: str, qid: str, k: int) -> str:
        params = dataclasses.replace(sampling, seed=derived_seed(seed, qid, k) % (2**31))
        completion, _ = await retry.call(lambda: backend.generate(prompt, params, request_id=f"filter-{qid}-{k}"), sem)
        return completion.text

    async def one_question(q: dict[str, Any]) -> None:
        qid = str(q["id"])
        prompt = render_prompt(tokenizer, q["question"], enable_thinking)
        responses = await asyncio.gather(*(one_sample(prompt, qid, k) for k in range(samples)))
        correct = [is_correct(r, q["answers"]) for r in responses]
        log.append({"id": qid, "responses": list(responses), "correct": correct, "answerable": any(correct)})
        bar.update(1)

    try:
        # Let every question finish (and be logged) before surfacing the first failure.
        results = await asyncio.gather(*(one_question(q) for q in todo), return_exceptions=True)
    finally:
        bar.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(todo)} questions failed; finished ones are saved in {log_path}, rerun to resume") from errors[0]
    return {str(q["id"]): log.by_key[str(q["id"])] for q in questions}
