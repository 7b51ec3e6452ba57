"""SGLang's native `POST /generate`: the request, the response, and their checks.

Why it exists: the lead's and the subagents' path on SGLang (text or `input_ids` in; generated
ids and per-token logprobs back in `meta_info`), and answer scoring by SGLang's input logprobs
(`return_logprob`, `logprob_start_len`, `max_new_tokens: 0`). `parser.serving.backends.http` speaks it,
`parser.serving.server` and the loopback worker answer it, all through these types.

    body = GenerateRequest.build("Hello", SamplingParams(max_new_tokens=8)).body()
    req = GenerateRequest.model_validate_json(raw, context=Bounds(vocab_size=151936).context())
"""
from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from parser.serving.types import BackendError, Completion, SamplingParams
from parser.serving.wire.common import (Count, JsonSchema, Prompt, Seed, Stop, StopTokenIds, Temperature, TokenIds, TopK, TopP,
                                WireModel, greedy, one_constraint, refuse)

DEFAULT_MAX = 128  # SGLang's max_new_tokens when a request gives none
Triple = tuple[float | None, int, Any]  # (logprob, token id, token text or None)


class SglangSampling(WireModel):
    max_new_tokens: Count = DEFAULT_MAX
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: TopK = -1
    stop: Stop = ()
    stop_token_ids: StopTokenIds = ()
    sampling_seed: Seed = None
    json_schema: JsonSchema = None
    regex: str | None = None

    @model_validator(mode="after")
    def _one_constraint(self) -> "SglangSampling":
        one_constraint(self.json_schema, self.regex)
        return self


class GenerateRequest(WireModel):
    text: Prompt | None = None
    input_ids: TokenIds | None = None
    sampling_params: SglangSampling = Field(default_factory=SglangSampling)
    return_logprob: bool = False
    logprob_start_len: int = -1  # input logprobs from this position on (-1: none)
    stream: bool = False

    @model_validator(mode="before")
    @classmethod
    def _exactly_one_prompt(cls, body: Any) -> Any:
        if isinstance(body, dict):
            if (body.get("text") is None) == (body.get("input_ids") is None):
                raise refuse("give exactly one of 'text' or 'input_ids'")
            if body.get("sampling_params") is None:
                body = {**body, "sampling_params": {}}
        return body

    @model_validator(mode="after")
    def _one_at_a_time(self) -> "GenerateRequest":
        if self.stream:
            raise refuse("stream=true is not supported")
        return self

    @property
    def prompt(self) -> str | list[int]:
        return self.input_ids if self.input_ids is not None else self.text  # type: ignore[return-value]

    @property
    def prompt_field(self) -> str:
        return "input_ids" if self.input_ids is not None else "text"

    def params(self) -> SamplingParams:
        sp = self.sampling_params
        return SamplingParams(max_new_tokens=sp.max_new_tokens, temperature=greedy(sp.temperature), top_p=sp.top_p,
                              top_k=sp.top_k, stop=sp.stop, stop_token_ids=sp.stop_token_ids, seed=sp.sampling_seed, return_logprobs=self.return_logprob,
                              **one_constraint(sp.json_schema, sp.regex))

    @classmethod
    def build(cls, prompt: str | list[int], s: SamplingParams) -> "GenerateRequest":
        """The client's request (no validation: the server judges it)."""
        params: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "temperature": s.temperature,
                                  "top_p": s.top_p, "top_k": s.top_k if s.top_k and s.top_k > 0 else -1}
        if s.stop:
            params["stop"] = tuple(s.stop)
        if s.stop_token_ids:
            params["stop_token_ids"] = tuple(s.stop_token_ids)
        if s.seed is not None:
            params["sampling_seed"] = s.seed
        if s.constraint is not None:
            params[s.constraint[0]] = s.constraint[1]
        fields: dict[str, Any] = {"input_ids" if isinstance(prompt, list) else "text": prompt,
                                  "sampling_params": SglangSampling.model_construct(**params)}
        if s.return_logprobs:
            fields["return_logprob"] = True
        return cls.model_construct(**fields)

    @classmethod
    def scoring(cls, ids: list[int], start: int, temperature: float) -> "GenerateRequest":
        """Input logprobs from `start` on, nothing generated."""
        params = SglangSampling.model_construct(temperature=temperature, top_p=1.0, top_k=-1, max_new_tokens=0)
        return cls.model_construct(input_ids=ids, return_logprob=True, logprob_start_len=start, sampling_params=params)


class MetaInfo(WireModel):
    id: str | None = None
    finish_reason: dict[str, Any] | str | None = None  # {"type": "stop" | "length" | "abort", ...}
    prompt_tokens: int | None = 0
    completion_tokens: int | None = None
    cached_tokens: int | None = 0
    e2e_latency: float | None = None
    output_token_logprobs: list[Triple] | None = None
    input_token_logprobs: list[Triple] | None = None

    def finish_kind(self, where: str) -> str | None:
        """SGLang's finish-reason type; an abort raises, retryable whatever its status_code: SGLang
        validates a request (a prompt over the context: HTTP 400, or ValueError from the in-process
        `sglang.Engine`) before it accepts it, so an abort in a result is this worker giving up on a
        request it took (memory, a restart, a fault), which another worker may serve
        (`parser.serving.backends.pool` moves the chunk). The HTTP client and the engine adapter both read
        aborts here (`parser.serving.wire.dialect.SGLANG`): one policy."""
        reason = self.finish_reason
        kind = reason.get("type") if isinstance(reason, dict) else reason
        if kind == "abort":
            code = reason.get("status_code") if isinstance(reason, dict) else None
            raise BackendError(
                f"{where}: request aborted by the server: "
                f"{reason.get('message') if isinstance(reason, dict) else reason}",
                retryable=True,
                status=code,
            )
        return kind


class GenerateResponse(WireModel):
    text: str
    output_ids: list[int] | None = None
    meta_info: MetaInfo

    @classmethod
    def of(cls, comp: Completion, *, request_id: str, logprobs: bool, input_logprobs: list[Triple] | None = None,
           latency: float | None = None) -> "GenerateResponse":
        n_out = len(comp.token_ids)
        reason: dict[str, Any] = {"type": "length", "length": n_out} if comp.finish_reason == "length" else {"type": "stop"}
        meta = MetaInfo(id=request_id, finish_reason=reason, prompt_tokens=comp.prompt_tokens, completion_tokens=n_out,
                        cached_tokens=comp.cached_tokens, e2e_latency=latency, input_token_logprobs=input_logprobs)
        if logprobs:  # one per generated token, or none when the backend gave none
            lps = comp.logprobs if comp.logprobs is not None else []
            meta.output_token_logprobs = [(lp, t, None) for lp, t in zip(lps, comp.token_ids, strict=bool(lps))]
        return cls(text=comp.text, output_ids=comp.token_ids, meta_info=meta)

    def completion(self, return_logprobs: bool, where: str) -> Completion:
        meta = self.meta_info
        kind = meta.finish_kind(where)
        triples = meta.output_token_logprobs or []
        return Completion(
            text=self.text,
            token_ids=list(self.output_ids or [t[1] for t in triples]),
            logprobs=[float(t[0]) for t in triples] if return_logprobs and triples else None,  # type: ignore[arg-type]
            finish_reason="length" if kind == "length" else "stop",
            prompt_tokens=int(meta.prompt_tokens or 0),
            cached_tokens=int(meta.cached_tokens or 0),
        )
