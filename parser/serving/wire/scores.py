"""Reading answer scores out of each wire format's reply: SGLang's `meta_info.input_token_logprobs`,
vLLM's `prompt_logprobs`, an OpenAI completions `echo`.

Why it exists: the HTTP client and the in-process SGLang engine read the same replies
(`parser.serving.wire.dialect`), so the alignment checks are written once, beside the types they
read; the conventions every scorer keeps are in `parser.serving.backends.scoring`.

    sglang_input_logprobs(meta_info, continuation_ids, "POST http://127.0.0.1:30000/generate")
"""
from __future__ import annotations

import math
from typing import Any

from parser.serving.types import BackendError


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
