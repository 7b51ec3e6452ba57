"""OpenAI `POST /v1/chat/completions`: the request, the response, and their checks.

Why it exists: the subagents' path on servers that render their own chat template (the client
sends messages, never text a template already rendered); `parser.serving.backends.http` speaks it,
`parser.serving.server` and the loopback worker answer it, all through these types. A request may set
template variables (`chat_template_kwargs`, e.g. {"enable_thinking": false}) but never a
template, nor one of `apply_chat_template`'s own parameters.

    body = ChatRequest.build(messages, SamplingParams(max_new_tokens=64), "vllm", {}).body()
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Mapping

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from parser.serving.types import SamplingParams
from parser.serving.wire.common import Count, WireModel, refuse
from parser.serving.wire.openai import OpenAIChoice, OpenAIRequest, OpenAIResponse, Server

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
MAX_KWARG_CHARS = 256  # of a string template variable
# apply_chat_template's own parameters: a client may set template variables, not these
RESERVED_TEMPLATE_KWARGS = frozenset({
    "chat_template", "tools", "documents", "tokenize", "add_generation_prompt", "continue_final_message",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "padding", "truncation", "max_length",
    "tokenizer_kwargs", "conversation",
})


def _role(value: Any) -> Any:
    if value not in ROLES:
        raise refuse("{role} is not one of {roles}", role=repr(str(value)[:40]), roles=", ".join(sorted(ROLES)))
    return value


def _content(value: Any) -> Any:
    if not (value is None or isinstance(value, str) or (isinstance(value, list) and all(isinstance(p, dict) for p in value))):
        raise refuse("expected a string or a list of content parts")
    return value


class ChatMessage(WireModel):
    """One message; other keys (name, tool_calls, ...) go to the template as they came."""

    model_config = ConfigDict(extra="allow")
    role: Annotated[str, BeforeValidator(_role)]

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, body: Any) -> Any:
        return body  # a message goes to the template as it came, nulls included (`content: null` with tool calls)

    content: Annotated[str | list[dict[str, Any]] | None, BeforeValidator(_content)] = None

    def size(self) -> int:
        """Characters the template will see (a structured message counts as its JSON)."""
        return len(self.content) if isinstance(self.content, str) else len(self.model_dump_json())


def _messages(value: Any) -> Any:
    if not isinstance(value, list) or not value or not all(isinstance(m, dict) for m in value):
        raise refuse("a chat's 'messages' must be a non-empty list of objects")
    return value


def _template_kwargs(value: dict[str, Any]) -> dict[str, Any]:
    """Template variables a client may set (`enable_thinking`): scalars, never a template."""
    for key, item in value.items():
        if key in RESERVED_TEMPLATE_KWARGS:
            raise refuse("not accepted from requests", at=key)
        if not (item is None or isinstance(item, (bool, int, float)) or (isinstance(item, str) and len(item) <= MAX_KWARG_CHARS)):
            raise refuse("expected a boolean, number or short string", at=key)
    return value


class ChatRequest(OpenAIRequest):
    DEFAULT_MAX: ClassVar[int] = 1024

    messages: Annotated[list[ChatMessage], BeforeValidator(_messages)]
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    chat_template: None = None
    chat_template_kwargs: Annotated[dict[str, Any], AfterValidator(_template_kwargs)] = Field(default_factory=dict)

    @field_validator("chat_template", mode="before")
    @classmethod
    def _no_template(cls, value: Any) -> None:
        raise refuse("templates are not accepted from requests; the server renders its model's own")

    @field_validator("chat_template_kwargs", mode="before")
    @classmethod
    def _kwargs_object(cls, value: Any) -> Any:
        return {} if value is None else value

    @model_validator(mode="after")
    def _what_is_implemented(self) -> "ChatRequest":
        if self.top_logprobs:
            raise refuse("top_logprobs={k}: the top-k alternatives are not implemented; logprobs true gives each "
                         "token's own", k=self.top_logprobs)
        return self

    def max_new(self) -> int:
        chosen = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self.DEFAULT_MAX if chosen is None else chosen

    def params(self) -> SamplingParams:
        return self.sampling(self.max_new(), logprobs=self.logprobs)

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_unset=True) for m in self.messages]

    @classmethod
    def build(cls, messages: list[dict[str, Any]], s: SamplingParams, server: Server,
              template_kwargs: Mapping[str, Any]) -> "ChatRequest":
        fields = cls.sampling_fields(s, server)
        if template_kwargs:
            fields["chat_template_kwargs"] = dict(template_kwargs)
        if s.return_logprobs:
            fields.update(logprobs=True, top_logprobs=0)
        return cls.model_construct(messages=[ChatMessage.model_construct(**m) for m in messages], **fields)


class ChatTokenLogprob(WireModel):
    token: str | None = None
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[dict[str, Any]] = Field(default_factory=list)


class ChatLogprobs(WireModel):
    content: list[ChatTokenLogprob] | None = None


class AssistantMessage(WireModel):
    role: str = "assistant"
    content: str | None = None


class ChatChoice(OpenAIChoice):
    message: AssistantMessage = Field(default_factory=AssistantMessage)
    logprobs: ChatLogprobs | None = None

    def read(self) -> tuple[str | None, list[Any] | None]:
        return self.message.content, [c.logprob for c in self.logprobs.content or []] if self.logprobs else None


class ChatResponse(OpenAIResponse):
    ID_PREFIX: ClassVar[str] = "chatcmpl-"
    object: str = "chat.completion"
    choices: list[ChatChoice] = Field(min_length=1)
