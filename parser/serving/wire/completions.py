"""OpenAI `POST /v1/completions`: the request, the response, and their checks.

Why it exists: the lead's path on vLLM (token-id prompts in, generated ids back with vLLM's
`return_token_ids`) and answer scoring (vLLM's `prompt_logprobs: 0`, or OpenAI's `echo` with
`max_tokens: 0` and `logprobs: 0`) are spoken by `parser.serving.backends.http`, answered by
`parser.serving.server` and the loopback worker; all three use these types.

    body = CompletionRequest.build([1, 2, 3], SamplingParams(max_new_tokens=8), "vllm").body()
    req = CompletionRequest.model_validate_json(raw, context=Bounds(vocab_size=151936).context())
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Sequence

from pydantic import BeforeValidator, Field, model_validator

from parser.serving.types import SamplingParams
from parser.serving.wire.common import Prompt, WireModel, refuse
from parser.serving.wire.openai import OpenAIChoice, OpenAIRequest, OpenAIResponse, Server


def _count_only(value: Any) -> Any:
    if isinstance(value, bool):
        raise refuse("expected an integer (the number of alternatives per token), got {value}", value=value)
    return value


class CompletionRequest(OpenAIRequest):
    DEFAULT_MAX: ClassVar[int] = 16

    prompt: Prompt
    logprobs: Annotated[int | None, BeforeValidator(_count_only)] = None
    echo: bool = False
    prompt_logprobs: Annotated[int | None, BeforeValidator(_count_only)] = None  # vLLM's

    @model_validator(mode="after")
    def _what_is_implemented(self) -> "CompletionRequest":
        if self.logprobs is not None and self.logprobs != 0:
            raise refuse("logprobs={k}: the top-k alternatives are not implemented; logprobs 0 gives each "
                         "token's own", k=self.logprobs)
        if self.prompt_logprobs not in (None, 0):
            raise refuse("prompt_logprobs: only 0 (the prompt tokens' own logprobs) is supported, got {k}",
                         k=self.prompt_logprobs)
        if self.echo and self.max_new() != 0:
            raise refuse("echo: only with max_tokens 0 (scoring the prompt)")
        return self

    def max_new(self) -> int:
        return self.DEFAULT_MAX if self.max_tokens is None else self.max_tokens

    def params(self) -> SamplingParams:
        return self.sampling(self.max_new(), logprobs=self.logprobs is not None)

    @classmethod
    def build(cls, prompt: str | list[int], s: SamplingParams, server: Server) -> "CompletionRequest":
        fields = cls.sampling_fields(s, server)
        if s.return_logprobs:
            fields["logprobs"] = 0  # per-token logprobs, no alternatives
        return cls.model_construct(prompt=prompt, **fields)

    @classmethod
    def scoring(cls, ids: list[int], server: Server, temperature: float) -> "CompletionRequest":
        """log p of given tokens: vLLM's prompt_logprobs (it samples one token it then drops), else an echo.
        The client names the served model, as for generation."""
        fields: dict[str, Any] = ({"prompt_logprobs": 0, "max_tokens": 1} if server == "vllm"
                                  else {"echo": True, "logprobs": 0, "max_tokens": 0})
        return cls.model_construct(prompt=ids, temperature=temperature, top_p=1.0, **fields)


class CompletionLogprobs(WireModel):
    tokens: list[str] | None = None
    token_logprobs: list[float | None] | None = None
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int] | None = None

    @classmethod
    def of(cls, tokens: list[str], logprobs: Sequence[float | None]) -> "CompletionLogprobs":
        offsets, pos = [], 0
        for token in tokens:
            offsets.append(pos)
            pos += len(token)
        return cls(tokens=tokens, token_logprobs=list(logprobs), text_offset=offsets)


class CompletionChoice(OpenAIChoice):
    text: str | None = None
    logprobs: CompletionLogprobs | None = None
    # vLLM's: per prompt position None (the first) or {token id: {"logprob", "rank", "decoded_token"}}
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None

    def read(self) -> tuple[str | None, list[Any] | None]:
        return self.text, self.logprobs.token_logprobs if self.logprobs else None


class CompletionResponse(OpenAIResponse):
    ID_PREFIX: ClassVar[str] = "cmpl-"
    object: str = "text_completion"
    choices: list[CompletionChoice] = Field(min_length=1)
