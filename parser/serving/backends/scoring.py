"""Answer scoring: `score(prompt_ids, continuation_ids) -> log p of each continuation token`.

Why it exists: an answer-conditioned reward (`parser.info_gain`, InfoMem) needs the log-likelihood
of a *given* text — the gold answer — after a prompt, which `generate` cannot give (it only scores
what it sampled). Every backend kind serves it (`Scorer` in `parser.serving.types`) with one
forward pass over prompt + continuation and no sampling:

| backend | request | where the values are |
|---|---|---|
| SGLang `/generate`, `sglang.Engine` | `input_ids`, `return_logprob`, `logprob_start_len = len(prompt) - 1`, `max_new_tokens: 0` | `meta_info.input_token_logprobs` |
| vLLM `/v1/completions` | token-id `prompt`, `prompt_logprobs: 0`, `max_tokens: 1` | `choices[0].prompt_logprobs` |
| other OpenAI completions | token-id `prompt`, `echo`, `logprobs: 0`, `max_tokens: 0` | `choices[0].logprobs.token_logprobs` |
| in process (transformers) | one forward pass | log_softmax of the logits |
| `parser.serving.server` | all three HTTP dialects above, by `backend.score` | |

The conventions every backend keeps, so two of them give the same numbers for the same model:
- token ids in, never text: the scored tokens must be the scorer's own tokens, and a text
  boundary tokenised jointly can differ from the two parts tokenised apart. The caller
  tokenises with the scorer's tokenizer (`build_backend` returns it);
- temperature 1 (log_softmax of the raw logits): SGLang scales input logprobs by the request's
  temperature, so the request says 1.0, and no top-k/top-p (filtering does not apply to
  teacher-forced tokens);
- the answer checks its own alignment: servers differ on where the first input logprob sits
  (SGLang puts a `None` for the token at `logprob_start_len`, vLLM for the first prompt token),
  so the parsers below take the *last* `len(continuation)` entries and, where the server names
  the tokens, check they are the continuation's ids. A misaligned or missing value is a
  non-retryable `BackendError` naming what came back — never a silently shifted score.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from parser.serving.types import BackendError

SCORE_TEMPERATURE = 1.0


def check_request(prompt_ids: Sequence[int], continuation_ids: Sequence[int], where: str) -> tuple[list[int], list[int]]:
    """Both parts as int lists; a prompt or continuation that is empty cannot be scored."""
    prompt = [int(t) for t in prompt_ids]
    continuation = [int(t) for t in continuation_ids]
    if not prompt:
        raise BackendError(f"{where}: score needs a non-empty prompt (the first token has no logprob)", retryable=False)
    if not continuation:
        raise BackendError(f"{where}: score needs a non-empty continuation", retryable=False)
    return prompt, continuation


def _finite(values: list[Any], where: str) -> list[float]:
    out = []
    for i, value in enumerate(values):
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise BackendError(f"{where}: continuation token {i} has no finite logprob ({value!r})", retryable=False)
        out.append(float(value))
    return out


def _tail(entries: Any, n: int, where: str, field: str) -> list[Any]:
    if not isinstance(entries, list) or len(entries) < n:
        got = len(entries) if isinstance(entries, list) else type(entries).__name__
        raise BackendError(f"{where}: {field} has {got} entries, fewer than the {n} continuation tokens", retryable=False)
    return entries[len(entries) - n:]


def sglang_input_logprobs(meta: Any, continuation: list[int], where: str) -> list[float]:
    """The continuation's logprobs from SGLang's `meta_info.input_token_logprobs`
    ((logprob, token_id, text) triples from `logprob_start_len` on)."""
    triples = _tail((meta or {}).get("input_token_logprobs") if isinstance(meta, dict) else None,
                    len(continuation), where, "meta_info.input_token_logprobs")
    ids = [t[1] if isinstance(t, (list, tuple)) and len(t) > 1 else None for t in triples]
    if ids != continuation:
        raise BackendError(f"{where}: input_token_logprobs name tokens {ids[:8]}..., not the continuation "
                           f"{continuation[:8]}... (logprob_start_len misread?)", retryable=False)
    return _finite([t[0] for t in triples], where)


def vllm_prompt_logprobs(entries: Any, continuation: list[int], where: str) -> list[float]:
    """The continuation's logprobs from vLLM's `prompt_logprobs`: per prompt position None (the
    first) or {token id (as a JSON string): {"logprob", "rank", "decoded_token"}}."""
    tail = _tail(entries, len(continuation), where, "choices[0].prompt_logprobs")
    values = []
    for i, (entry, token) in enumerate(zip(tail, continuation, strict=True)):
        item = entry.get(str(token)) if isinstance(entry, dict) else None
        if not isinstance(item, dict):
            raise BackendError(f"{where}: prompt_logprobs at continuation token {i} has no entry for token {token} "
                               f"({str(entry)[:120]})", retryable=False)
        values.append(item.get("logprob"))
    return _finite(values, where)


def echo_token_logprobs(logprobs: Any, prompt_len: int, continuation: list[int], where: str) -> list[float]:
    """The continuation's logprobs from an OpenAI completions `echo` answer with `max_tokens: 0`:
    `logprobs.token_logprobs` covers exactly the echoed prompt + continuation (first None)."""
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    expected = prompt_len + len(continuation)
    if not isinstance(values, list) or len(values) != expected:
        got = len(values) if isinstance(values, list) else type(values).__name__
        raise BackendError(f"{where}: echo gave {got} token logprobs for the {expected} tokens sent (does this server "
                           "echo token-id prompts with max_tokens 0?)", retryable=False)
    return _finite(values[prompt_len:], where)
