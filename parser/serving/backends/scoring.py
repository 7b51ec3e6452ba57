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
  so the parsers (`parser.serving.wire.scores`) take the *last* `len(continuation)` entries and, where the server names
  the tokens, check they are the continuation's ids. A misaligned or missing value is a
  non-retryable `BackendError` naming what came back — never a silently shifted score.
"""
from __future__ import annotations

from typing import Sequence

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
