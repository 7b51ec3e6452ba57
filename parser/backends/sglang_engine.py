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

Must never: be imported on CPU installs at module import time (sglang is GPU-only).
"""
from __future__ import annotations

import uuid
from typing import Any, Sequence

from parser.backends.base import BackendError, Completion, Prompt, SamplingParams
from parser.backends.scoring import SCORE_TEMPERATURE, check_request, sglang_input_logprobs


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
        kwargs = self._prompt_kwargs(prompt)
        # rid must be unique per in-flight request; keep the trajectory id in it for tracing.
        rid = f"{request_id or 'req'}-{uuid.uuid4().hex[:12]}"
        try:
            out = await self.engine.async_generate(
                sampling_params=sampling_params(sampling),
                return_logprob=True,  # the token ids come back with the logprobs
                rid=rid,
                **kwargs,
            )
        except (ValueError, TypeError) as e:  # bad request: not worth a retry
            raise BackendError(f"sglang.Engine rejected the request: {e}", retryable=False) from e
        except Exception as e:  # the engine's subprocesses died or timed out
            raise BackendError(f"sglang.Engine failed: {type(e).__name__}: {e}", retryable=True) from e
        return parse_output(out, sampling, worker=self.name)

    async def score(
        self,
        prompt_ids: Sequence[int],
        continuation_ids: Sequence[int],
        *,
        routing_key: str | None = None,
        request_id: str | None = None,
    ) -> list[float]:
        """Input logprobs of `continuation_ids` (parser.backends.scoring): one prefill, zero new tokens."""
        prompt, continuation = check_request(prompt_ids, continuation_ids, "SGLangEngineBackend")
        rid = f"{request_id or 'score'}-{uuid.uuid4().hex[:12]}"
        try:
            out = await self.engine.async_generate(
                input_ids=prompt + continuation,
                sampling_params={"max_new_tokens": 0, "temperature": SCORE_TEMPERATURE, "top_p": 1.0, "top_k": -1},
                return_logprob=True,
                logprob_start_len=len(prompt) - 1,
                rid=rid,
            )
        except (ValueError, TypeError) as e:
            raise BackendError(f"sglang.Engine rejected the scoring request: {e}", retryable=False) from e
        except Exception as e:  # the engine's subprocesses died or timed out
            raise BackendError(f"sglang.Engine failed: {type(e).__name__}: {e}", retryable=True) from e
        if isinstance(out, list):
            out = out[0] if out else {}
        meta = out.get("meta_info") if isinstance(out, dict) else None
        if not isinstance(meta, dict):
            raise BackendError(f"sglang.Engine: unexpected scoring output {str(out)[:200]!r}", retryable=True)
        return sglang_input_logprobs(meta, continuation, "sglang.Engine")

    async def aclose(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()

    # ------------------------------------------------------------------ helpers
    def _prompt_kwargs(self, prompt: Prompt) -> dict[str, Any]:
        if isinstance(prompt, str):
            return {"prompt": prompt}
        items = list(prompt)
        if items and isinstance(items[0], dict):
            text = self.tokenizer.apply_chat_template(items, tokenize=False, add_generation_prompt=True)
            return {"prompt": text}
        if not items:
            raise BackendError("SGLangEngineBackend: empty prompt", retryable=False)
        return {"input_ids": [int(t) for t in items]}

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer


def sampling_params(s: SamplingParams) -> dict[str, Any]:
    """Our SamplingParams as SGLang's sampling_params dict."""
    params: dict[str, Any] = {
        "max_new_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k and s.top_k > 0 else -1,
    }
    if s.stop:
        params["stop"] = list(s.stop)
    if s.seed is not None:
        params["sampling_seed"] = s.seed
    return params


def parse_output(out: Any, s: SamplingParams, *, worker: str | None = None) -> Completion:
    """One `async_generate` result (a dict, or a one-element batch) as a Completion."""
    if isinstance(out, list):
        out = out[0] if out else {}
    if not isinstance(out, dict) or "meta_info" not in out:
        raise BackendError(f"sglang.Engine: unexpected output {str(out)[:200]!r}", retryable=True)
    meta = out["meta_info"]
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind == "abort":
        message = reason.get("message") if isinstance(reason, dict) else reason
        code = reason.get("status_code") if isinstance(reason, dict) else None
        raise BackendError(f"sglang.Engine aborted the request: {message}",
                           retryable=not (isinstance(code, int) and 400 <= code < 500), status=code)
    triples = meta.get("output_token_logprobs") or []
    token_ids = out.get("output_ids") or [int(t[1]) for t in triples]
    logprobs = [float(t[0]) for t in triples] if s.return_logprobs and triples else None
    return Completion(
        text=out.get("text", ""),
        token_ids=[int(t) for t in token_ids],
        logprobs=logprobs,
        finish_reason="length" if kind == "length" else "stop",
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        cached_tokens=int(meta.get("cached_tokens") or 0),
        worker=worker,
    )
