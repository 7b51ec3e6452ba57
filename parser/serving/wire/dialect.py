"""`Dialect`: one object per wire format, the only place a path, a prompt kind or a reply shape is
tied to its pydantic request/response pair.

Why it exists: four users speak these formats — the HTTP client (`parser.serving.backends.http`),
the in-process SGLang engine (`parser.serving.backends.sglang_engine`, which takes `POST /generate`'s
body), the CPU server (`parser.serving.server`) and the loopback worker (`parser.serving.loopback`).
Each once kept its own table from path to types, and the engine's copy drifted (it dropped
constraints and read aborts its own way). Now each asks `DIALECTS[api]`: a new wire format is a
`wire/<format>.py` pair plus one row here, and no user grows a branch.

Client side: `body` (refuses a prompt kind the format does not take; built by the request type, so
a constraint is always included), `completion` (one abort policy: `MetaInfo.finish_kind`, for HTTP
and the engine alike), `scoring_body` / `scores` where the format scores given tokens. Server side:
`read` (the request checked against the server's `Bounds`), `reply`, `empty_reply` (the loopback's
"HTTP 200 but no completion" fault).

    body = DIALECTS["sglang"].body([1, 2, 3], SamplingParams(max_new_tokens=8, regex="a+"))
    comp = DIALECTS["sglang"].completion(reply_json, sampling, where="POST http://127.0.0.1:30000/generate")
    for d in DIALECTS.values(): app.router.add_post(d.path, handler(d))
"""
from __future__ import annotations

import dataclasses
import uuid
from typing import Any, Callable, Literal, Mapping, Sequence

from parser.serving.types import BackendError, Completion, Prompt, SamplingParams
from parser.serving.wire.chat import AssistantMessage, ChatChoice, ChatLogprobs, ChatRequest, ChatResponse, ChatTokenLogprob
from parser.serving.wire.common import Bounds, Usage, WireModel
from parser.serving.wire.completions import CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse
from parser.serving.wire.openai import Server
from parser.serving.wire.scores import echo_token_logprobs, sglang_input_logprobs, vllm_prompt_logprobs
from parser.serving.wire.sglang import GenerateRequest, GenerateResponse, Triple

Api = Literal["sglang", "completions", "chat"]
PromptKind = Literal["ids", "text", "messages"]
MAX_QUOTED = 300  # characters of a refused reply, or of its error, quoted in a BackendError


def prompt_kind(prompt: Prompt) -> tuple[PromptKind, Any]:
    """("text", str) | ("messages", list of dicts) | ("ids", list[int]): token ids come as any int sequence."""
    if isinstance(prompt, str):
        return "text", prompt
    items = list(prompt)
    if items and isinstance(items[0], dict):
        return "messages", items
    return "ids", [int(t) for t in items]


def _quote(value: Any) -> str:
    """`value`'s words on one line, cut at MAX_QUOTED (pydantic's errors span several lines: the
    command that ends on this error says it in one)."""
    text = " ".join(str(value).split())
    return text if len(text) <= MAX_QUOTED else f"{text[:MAX_QUOTED]}... [{len(text)} chars]"


@dataclasses.dataclass(frozen=True)
class Dialect:
    """One wire format. Subclasses below fill in what differs; the fields say what is tied to what."""

    name: Api
    path: str
    request: type[WireModel]
    response: type[WireModel]
    takes: frozenset[PromptKind]
    refusals: Mapping[PromptKind, str]  # why a prompt kind it does not take is refused, and what to use instead
    names_model: bool  # its requests carry `model` (the client fills it in from GET /v1/models)

    # ------------------------------------------------------------------ client side
    def body(self, prompt: Prompt, s: SamplingParams, *, server: Server = "sglang",
             chat_kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The request body for `prompt` under `s` (no validation: the server judges it)."""
        kind, value = prompt_kind(prompt)
        if kind not in self.takes:
            raise ValueError(f"api={self.name!r}: {self.refusals[kind]}")
        return self._build(value, s, server, chat_kwargs or {}).body()

    def completion(self, raw: Any, s: SamplingParams, *, where: str) -> Completion:
        """A reply read as this format's response; an abort raises (retryable, `MetaInfo.finish_kind`),
        and so does a reply that is no completion (the worker's fault: another may serve it)."""
        try:
            return self._completion(raw, s, where)
        except (IndexError, TypeError, ValueError) as error:  # pydantic's ValidationError is a ValueError
            raise BackendError(f"{where}: the reply is not a {self.name} completion ({type(error).__name__}: "
                               f"{_quote(error)}): {str(raw)[:200]}", retryable=True) from error

    def scoring_body(self, ids: list[int], start: int, *, server: Server, temperature: float) -> dict[str, Any]:
        """A request for the logprobs of `ids[start + 1:]` (`parser.serving.backends.scoring`), nothing sampled."""
        raise NotImplementedError

    def scores(self, raw: Any, prompt_len: int, continuation: list[int], *, server: Server, where: str) -> list[float]:
        """The continuation's logprobs from a reply to `scoring_body`; a misaligned one is refused (wire.scores)."""
        try:
            return self._scores(raw, prompt_len, continuation, server, where)
        except ValueError as error:  # pydantic's ValidationError
            raise BackendError(f"{where}: the reply holds no scores ({_quote(error)}): {str(raw)[:200]}",
                               retryable=True) from error

    # ------------------------------------------------------------------ server side
    def read(self, raw: bytes, bounds: Bounds) -> Any:
        """The request, checked against the server's bounds; pydantic's ValidationError when refused
        (`parser.serving.wire.common.describe` names the fields)."""
        return self.request.model_validate_json(raw, context=bounds.context())

    def prompt_of(self, request: Any) -> Any:
        """What the request asks the model to continue (text, token ids, or the chat messages)."""
        return request.prompt

    def reply(self, comp: Completion, *, model: str, logprobs: bool, token_text: Callable[[int], str] = str,
              **meta: Any) -> dict[str, Any]:
        """The response body for `comp`; `token_text` spells a token id where the format shows tokens."""
        raise NotImplementedError

    def empty_reply(self) -> dict[str, Any]:
        """An HTTP 200 body that no client can read as a completion (the loopback's `garbage` fault)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ per format
    def _build(self, prompt: Any, s: SamplingParams, server: Server, chat_kwargs: Mapping[str, Any]) -> WireModel:
        raise NotImplementedError

    def _completion(self, raw: Any, s: SamplingParams, where: str) -> Completion:
        raise NotImplementedError

    def _scores(self, raw: Any, prompt_len: int, continuation: list[int], server: Server, where: str) -> list[float]:
        raise NotImplementedError


def _one(raw: Any) -> Any:
    """A server may answer batch-shaped: a list of one result."""
    return raw[0] if isinstance(raw, list) and raw else raw


@dataclasses.dataclass(frozen=True)
class SglangDialect(Dialect):
    """SGLang's native `POST /generate`; `sglang.Engine.async_generate` takes the same body."""

    def _build(self, prompt: Any, s: SamplingParams, server: Server, chat_kwargs: Mapping[str, Any]) -> WireModel:
        return GenerateRequest.build(prompt, s)

    def _completion(self, raw: Any, s: SamplingParams, where: str) -> Completion:
        return GenerateResponse.model_validate(_one(raw)).completion(s.return_logprobs, where)

    def scoring_body(self, ids: list[int], start: int, *, server: Server, temperature: float) -> dict[str, Any]:
        return GenerateRequest.scoring(ids, start, temperature).body()

    def _scores(self, raw: Any, prompt_len: int, continuation: list[int], server: Server, where: str) -> list[float]:
        meta = GenerateResponse.model_validate(_one(raw)).meta_info
        meta.finish_kind(where)
        return sglang_input_logprobs(meta.model_dump(), continuation, where)

    def engine_kwargs(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` as `sglang.Engine.async_generate` keywords: the engine takes `POST /generate`'s body
        with `text` named `prompt` and `stop` a list, so it gets every field the HTTP client sends (a
        constraint included). Logprobs are always asked for: older engines return the generated ids
        only with them (`completion` keeps them only when the sampling asked)."""
        kwargs = {("prompt" if key == "text" else key): value for key, value in body.items()}
        params = kwargs.get("sampling_params")
        if params and "stop" in params:
            kwargs["sampling_params"] = {**params, "stop": list(params["stop"])}
        kwargs["return_logprob"] = True
        return kwargs

    def reply(self, comp: Completion, *, model: str, logprobs: bool, token_text: Callable[[int], str] = str,
              input_logprobs: list[Triple] | None = None, latency: float | None = None, **meta: Any) -> dict[str, Any]:
        return GenerateResponse.of(comp, request_id=uuid.uuid4().hex, logprobs=logprobs, input_logprobs=input_logprobs,
                                   latency=latency).reply()

    def empty_reply(self) -> dict[str, Any]:
        return {"text": None, "meta_info": {"finish_reason": {"type": "stop"}}}


def _usage(comp: Completion) -> Usage:
    return Usage.of(comp.prompt_tokens, len(comp.token_ids), comp.cached_tokens)


@dataclasses.dataclass(frozen=True)
class OpenAIDialect(Dialect):
    """What OpenAI's two paths share: the reply's frame (`parser.serving.wire.openai`)."""

    def _completion(self, raw: Any, s: SamplingParams, where: str) -> Completion:
        return self.response.model_validate(raw).completion(s.return_logprobs)  # type: ignore[attr-defined]

    def empty_reply(self) -> dict[str, Any]:
        return {"choices": []}


@dataclasses.dataclass(frozen=True)
class CompletionsDialect(OpenAIDialect):
    """OpenAI `POST /v1/completions` (vLLM's extensions: `return_token_ids`, `prompt_logprobs`)."""

    def _build(self, prompt: Any, s: SamplingParams, server: Server, chat_kwargs: Mapping[str, Any]) -> WireModel:
        return CompletionRequest.build(prompt, s, server)

    def scoring_body(self, ids: list[int], start: int, *, server: Server, temperature: float) -> dict[str, Any]:
        return CompletionRequest.scoring(ids, server, temperature).body()

    def _scores(self, raw: Any, prompt_len: int, continuation: list[int], server: Server, where: str) -> list[float]:
        choice = CompletionResponse.model_validate(raw).choices[0]
        if server == "vllm":
            return vllm_prompt_logprobs(choice.prompt_logprobs, continuation, where)
        return echo_token_logprobs(choice.logprobs.model_dump() if choice.logprobs else None, prompt_len,
                                   continuation, where)

    def reply(self, comp: Completion, *, model: str, logprobs: bool, token_text: Callable[[int], str] = str,
              token_ids: bool = False, scored: tuple[Sequence[int], Sequence[float | None]] | None = None,
              prompt_logprobs: list[Any] | None = None, **meta: Any) -> dict[str, Any]:
        """`scored`: (ids, logprobs) shown instead of the generated tokens' (an `echo` of the prompt)."""
        block = None
        if logprobs:
            ids, values = scored if scored is not None else (comp.token_ids, comp.logprobs or [])
            block = CompletionLogprobs.of([token_text(t) for t in ids], values)
        choice = CompletionChoice(text=comp.text, logprobs=block, finish_reason=comp.finish_reason,
                                  token_ids=comp.token_ids if token_ids else None, prompt_logprobs=prompt_logprobs)
        return CompletionResponse.of(model, choice, _usage(comp)).reply()


@dataclasses.dataclass(frozen=True)
class ChatDialect(OpenAIDialect):
    """OpenAI `POST /v1/chat/completions`: the server renders its own chat template."""

    def _build(self, prompt: Any, s: SamplingParams, server: Server, chat_kwargs: Mapping[str, Any]) -> WireModel:
        return ChatRequest.build(prompt, s, server, chat_kwargs)

    def scoring_body(self, ids: list[int], start: int, *, server: Server, temperature: float) -> dict[str, Any]:
        raise BackendError(f"api={self.name!r}: a chat server renders the template itself and scores no given "
                           "tokens; score with api='completions' (vLLM) or api='sglang'", retryable=False)

    def prompt_of(self, request: Any) -> Any:
        return request.template_messages()

    def reply(self, comp: Completion, *, model: str, logprobs: bool, token_text: Callable[[int], str] = str,
              token_ids: bool = False, **meta: Any) -> dict[str, Any]:
        block = None
        if logprobs:
            lps = comp.logprobs if comp.logprobs is not None else []
            block = ChatLogprobs(content=[ChatTokenLogprob(token=token_text(t), logprob=lp)
                                          for t, lp in zip(comp.token_ids, lps, strict=bool(lps))])
        choice = ChatChoice(message=AssistantMessage(content=comp.text), logprobs=block, finish_reason=comp.finish_reason,
                            token_ids=comp.token_ids if token_ids else None)
        return ChatResponse.of(model, choice, _usage(comp)).reply()


SGLANG = SglangDialect(
    name="sglang", path="/generate", request=GenerateRequest, response=GenerateResponse,
    takes=frozenset({"ids", "text"}), names_model=False,
    refusals={"messages": "prompt is a message list; render it to text first or use api='chat'"})
COMPLETIONS = CompletionsDialect(
    name="completions", path="/v1/completions", request=CompletionRequest, response=CompletionResponse,
    takes=frozenset({"ids", "text"}), names_model=True,
    refusals={"messages": "prompt is a message list; use api='chat'"})
CHAT = ChatDialect(
    name="chat", path="/v1/chat/completions", request=ChatRequest, response=ChatResponse,
    takes=frozenset({"messages"}), names_model=True,
    refusals={"text": "prompt is text, but a chat server renders the chat template itself; send chat messages "
                      "(SubagentReader does for backends with renders_chat_template), or use api='completions' for "
                      "text a template has already rendered",
              "ids": "prompt is token ids (the lead's exact token stream); serve the lead with api='completions' "
                     "(server: vllm returns the generated ids) or api='sglang'"})
DIALECTS: Mapping[Api, Dialect] = {d.name: d for d in (SGLANG, COMPLETIONS, CHAT)}
