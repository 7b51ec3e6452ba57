"""In-process `sglang.Engine` backend (GPU): one engine, no HTTP hop, RadixCache prefix reuse.

Why it exists: on a single GPU node the lead and the subagents can share one in-process
SGLang engine (evaluation, the demo on a GPU box) without starting servers. The engine's
RadixCache shares the `instructions + chunk` prefix across subagent rounds by itself, so the
routing key has nothing to pin here (the gateway uses it when there are several workers).

    backend = SGLangEngineBackend(model_path="Qwen/Qwen3.5-4B", mem_fraction_static=0.7)
    c = await backend.generate(token_ids, SamplingParams(max_new_tokens=512, return_logprobs=True))
    logprobs = await backend.score(prompt_ids, answer_ids)   # input logprobs, zero new tokens

`sglang` is imported inside the constructor, so CPU installs never need it (`gpu` extra).
Keyword arguments go to `sglang.Engine` (= `sglang.srt.server_args.ServerArgs` fields).
Checked against sglang 0.5.x: `Engine.async_generate(prompt=|input_ids=, sampling_params=,
return_logprob=, rid=)` returns `{"text", "output_ids", "meta_info"}` with `meta_info`
holding `finish_reason` ({"type": "stop"|"length"|"abort", ...}), `prompt_tokens`,
`cached_tokens` and `output_token_logprobs` as (logprob, token_id, text) triples; the
logprobs are SGLang's (after temperature, before top-p/top-k, unless the server sets
SGLANG_RETURN_ORIGINAL_LOGPROB). The engine binds to the first event loop that awaits it:
use one loop for the backend's lifetime.

The request and its reading are the `SGLANG` dialect's (`parser.serving.wire.dialect`), the same
code as HTTP `/generate` (`SGLANG.body`, `SGLANG.engine_kwargs`, `SGLANG.completion`): a constraint
in `SamplingParams` reaches the engine as `sampling_params.json_schema` / `.regex`, and an abort
follows the one policy of `MetaInfo.finish_kind`. A request the engine refuses up front
(ValueError, TypeError: what SGLang's HTTP server answers with a 400) is not retried.

Must never: be imported on CPU installs at module import time (sglang is GPU-only).
"""
from __future__ import annotations

import uuid
from typing import Any, Sequence

from parser.serving.types import BackendError, Completion, Prompt, SamplingParams
from parser.serving.backends.scoring import SCORE_TEMPERATURE, check_request
from parser.serving.wire.dialect import SGLANG, prompt_kind

WHERE = "sglang.Engine"  # how errors name this backend


class SGLangEngineBackend:
    """`Backend` over an in-process `sglang.Engine` (or one passed in as `engine=`)."""

    def __init__(self, model_path: str | None = None, *, engine: Any = None, tokenizer: Any = None,
                 name: str = "sglang_engine", **engine_kwargs: Any):
        if engine is None:
            if model_path is None:
                raise ValueError("SGLangEngineBackend: give model_path or engine")
            try:
                import sglang
            except ImportError as e:  # pragma: no cover - depends on the install
                raise BackendError("SGLangEngineBackend needs sglang (pip install 'parser-agents[gpu]')",
                                   retryable=False) from e
            engine_kwargs.setdefault("log_level", "error")
            engine = sglang.Engine(model_path=model_path, **engine_kwargs)
        self.engine = engine
        self.model_path = model_path
        self._tokenizer = tokenizer
        self.name = name

    # ------------------------------------------------------------------ Backend protocol
    async def generate(
        self,
        prompt: Prompt,
        sampling: SamplingParams,
        *,
        routing_key: str | None = None,
        request_id: str | None = None,
    ) -> Completion:
        out = await self._call(SGLANG.body(self._prompt(prompt), sampling), request_id or "req")
        completion = SGLANG.completion(out, sampling, where=WHERE)
        completion.worker = self.name
        return completion

    async def score(
        self,
        prompt_ids: Sequence[int],
        continuation_ids: Sequence[int],
        *,
        routing_key: str | None = None,
        request_id: str | None = None,
    ) -> list[float]:
        """Input logprobs of `continuation_ids` (parser.serving.backends.scoring): one prefill, zero new tokens."""
        prompt, continuation = check_request(prompt_ids, continuation_ids, "SGLangEngineBackend")
        body = SGLANG.scoring_body(prompt + continuation, len(prompt) - 1, server="sglang", temperature=SCORE_TEMPERATURE)
        out = await self._call(body, request_id or "score")
        return SGLANG.scores(out, len(prompt), continuation, server="sglang", where=WHERE)

    async def _call(self, body: dict[str, Any], rid_prefix: str) -> Any:
        """`async_generate` with `POST /generate`'s body; the engine's own failures as `BackendError`."""
        # rid must be unique per in-flight request; keep the trajectory id in it for tracing.
        rid = f"{rid_prefix}-{uuid.uuid4().hex[:12]}"
        try:
            return await self.engine.async_generate(**SGLANG.engine_kwargs(body), rid=rid)
        except (ValueError, TypeError) as e:  # the engine validated the request and refused it
            raise BackendError(f"{WHERE} rejected the request: {e}", retryable=False) from e
        except Exception as e:  # the engine's subprocesses died or timed out
            raise BackendError(f"{WHERE} failed: {type(e).__name__}: {e}", retryable=True) from e

    async def aclose(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()

    # ------------------------------------------------------------------ helpers
    def _prompt(self, prompt: Prompt) -> str | list[int]:
        """Text or token ids as `/generate` takes them (`prompt_kind`, the dialects' own reading of a
        prompt); chat messages rendered with the tokenizer."""
        kind, value = prompt_kind(prompt)
        if kind == "messages":
            return self.tokenizer.apply_chat_template(value, tokenize=False, add_generation_prompt=True)
        if kind == "ids" and not value:
            raise BackendError("SGLangEngineBackend: empty prompt", retryable=False)
        return value

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer

