"""What OpenAI's `/v1/completions` and `/v1/chat/completions` share: the sampling fields, the
constraint fields of each server (vLLM's `structured_outputs`, SGLang's `regex`, OpenAI's
`response_format`), the OpenAI fields this code does not implement, and the response's frame
(id, model, usage; a choice's finish reason and vLLM's token ids).

Why it exists: the two OpenAI paths take the same sampling fields; `OpenAIRequest` holds them
once for both request types (`parser.serving.wire.completions`, `parser.serving.wire.chat`). A field a client
may send but nothing here implements (tools, logit bias, penalties, top-k alternatives ...) is
refused by name, never silently ignored; a key OpenAI does not define is ignored, as vLLM does.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, ClassVar, Literal

import orjson
from pydantic import Field, model_validator

from parser.serving.types import BackendError, Completion, SamplingParams
from parser.serving.wire.common import (Count, JsonSchema, Seed, Stop, StopTokenIds, Temperature, TopK, TopP, Usage, WireModel,
                                greedy, one_constraint, refuse)

Server = Literal["sglang", "vllm", "generic"]
ANY_JSON_OBJECT = '{"type": "object"}'  # response_format json_object: what vLLM's JSON grammar accepts

# OpenAI fields with the values that leave the answer as if they were absent
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "parallel_tool_calls": (None, True, False), "logit_bias": (None, {}), "frequency_penalty": (None, 0),
    "presence_penalty": (None, 0), "best_of": (None, 1), "suffix": (None, ""), "audio": (None,),
    "modalities": (None, ["text"]), "prediction": (None,), "web_search_options": (None,),
    "reasoning_effort": (None,), "stream_options": (None,),
}


class JsonSchemaFormat(WireModel):
    name: str | None = None
    schema_: JsonSchema = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(WireModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(WireModel):
    """vLLM's constrained decoding fields."""

    json_: JsonSchema = Field(default=None, alias="json")
    regex: str | None = None
    disable_any_whitespace: bool | None = None


class OpenAIRequest(WireModel):
    DEFAULT_MAX: ClassVar[int] = 16

    model: str | None = None
    max_tokens: Count | None = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: TopK = -1  # SGLang/vLLM extension to the OpenAI schema
    stop: Stop = ()
    stop_token_ids: StopTokenIds = ()  # SGLang/vLLM extension: generation ends on any of these ids
    seed: Seed = None
    n: int = 1
    stream: bool = False
    return_token_ids: bool | None = None  # vLLM's: the generated ids in `choices[0].token_ids`
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    regex: str | None = None  # SGLang's
    json_schema: JsonSchema = None  # SGLang's

    @model_validator(mode="before")
    @classmethod
    def _not_implemented(cls, body: Any) -> Any:
        if isinstance(body, dict):
            named = sorted(key for key, neutral in _NEUTRAL.items() if key in body and body[key] not in neutral)
            if named:
                raise refuse("{fields}: not implemented by this server; leave them out", fields=", ".join(named))
        return body

    @model_validator(mode="after")
    def _one_at_a_time(self) -> "OpenAIRequest":
        if self.stream:
            raise refuse("stream=true is not supported")
        if self.n != 1:
            raise refuse("n={n}; only n=1 is supported", n=self.n)
        self.constraint()
        return self

    def constraint(self) -> dict[str, str]:
        """SamplingParams' json_schema / regex, from whichever dialect's field carries it."""
        structured = self.structured_outputs or StructuredOutputs()
        schema = self.json_schema if self.json_schema is not None else structured.json_
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            schema = ANY_JSON_OBJECT
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.json_schema is None or fmt.json_schema.schema_ is None:
                raise refuse("response_format.json_schema.schema: missing")
            schema = fmt.json_schema.schema_
        return one_constraint(schema, self.regex if self.regex is not None else structured.regex)

    def sampling(self, max_new_tokens: int, logprobs: bool) -> SamplingParams:
        return SamplingParams(max_new_tokens=max_new_tokens, temperature=greedy(self.temperature), top_p=self.top_p,
                              top_k=self.top_k, stop=self.stop, stop_token_ids=self.stop_token_ids, seed=self.seed,
                              return_logprobs=logprobs,
                              **self.constraint())

    @classmethod
    def sampling_fields(cls, s: SamplingParams, server: Server) -> dict[str, Any]:
        """The client's request fields for `s` on `server` (no validation: the server judges them)."""
        fields: dict[str, Any] = {"max_tokens": s.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p}
        if s.top_k != -1:
            fields["top_k"] = s.top_k
        if s.stop:
            fields["stop"] = tuple(s.stop)
        if s.stop_token_ids:
            fields["stop_token_ids"] = tuple(s.stop_token_ids)
        if s.seed is not None:
            fields["seed"] = s.seed
        if server == "vllm":
            fields["return_token_ids"] = True
        if s.constraint is not None:
            fields.update(_constraint_fields(server, *s.constraint))
        return fields


def _constraint_fields(server: Server, kind: str, spec: str) -> dict[str, Any]:
    """The request fields that make `server` decode under a JSON schema or a regex."""
    if server == "vllm":
        if kind == "regex":
            return {"structured_outputs": StructuredOutputs.model_construct(regex=spec)}
        # compact JSON, as in process: a budgeted reply spends no tokens on free whitespace
        return {"structured_outputs": StructuredOutputs.model_construct(json_=orjson.loads(spec),
                                                                         disable_any_whitespace=True)}
    if server == "sglang":
        if kind == "regex":
            return {"regex": spec}
        return {"response_format": ResponseFormat.model_construct(
            type="json_schema", json_schema=JsonSchemaFormat.model_construct(name="output", schema_=orjson.loads(spec)))}
    raise BackendError(f"HttpBackend(server='generic'): no known way to constrain decoding by {kind} on this "
                       "server (llama.cpp ignores json_schema on completions); set server: vllm or sglang, or "
                       "turn the constraint off", retryable=False)


class OpenAIChoice(WireModel):
    index: int = 0
    finish_reason: str | None = None
    token_ids: list[int] | None = None  # vLLM's return_token_ids

    def read(self) -> tuple[str | None, list[Any] | None]:
        """(the generated text, its per-token logprobs) wherever this dialect keeps them."""
        raise NotImplementedError


class OpenAIResponse(WireModel):
    """The frame of both OpenAI responses; a subclass names its `object` and its choice type."""

    ID_PREFIX: ClassVar[str] = ""
    id: str | None = None
    object: str = ""
    created: int | None = None
    model: str | None = None
    choices: list[Any] = Field(min_length=1)
    usage: Usage | None = None

    @classmethod
    def of(cls, model: str, choice: OpenAIChoice, usage: Usage) -> Any:
        return cls(id=cls.ID_PREFIX + uuid.uuid4().hex, created=int(time.time()), model=model, choices=[choice], usage=usage)

    def completion(self, return_logprobs: bool) -> Completion:
        choice = self.choices[0]
        text, logprobs = choice.read()
        prompt_tokens, cached = (self.usage or Usage()).counts()
        return Completion(text=text or "", token_ids=list(choice.token_ids or []),
                          logprobs=[float(x) for x in logprobs] if return_logprobs and logprobs else None,
                          finish_reason="length" if choice.finish_reason == "length" else "stop",
                          prompt_tokens=prompt_tokens, cached_tokens=cached)
