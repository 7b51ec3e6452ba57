"""`Dialect`: a body the client builds is the request the server reads, a reply the server writes is
the completion the client reads, a prompt kind a format does not take is refused, and an SGLang
abort means the same over HTTP and from the in-process engine.

    .venv/bin/pytest tests/test_wire_dialect_on_cpu.py -q
"""
from __future__ import annotations

import asyncio

import orjson
import pytest
from aiohttp import web

from parser.serving.backends.http import HttpBackend
from parser.serving.backends.sglang_engine import SGLangEngineBackend
from parser.serving.server import ServerHandle, json_response
from parser.serving.types import BackendError, Completion, SamplingParams
from parser.serving.wire.common import Bounds
from parser.serving.wire.dialect import CHAT, COMPLETIONS, DIALECTS, SGLANG

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
PROMPTS = {"sglang": [3, 4, 5], "completions": "Query: who?", "chat": MESSAGES}
ABORT = {"text": "", "meta_info": {"finish_reason": {"type": "abort", "message": "out of memory", "status_code": 400}}}


def test_the_table_names_each_format_once():
    assert [(d.name, d.path) for d in DIALECTS.values()] == [
        ("sglang", "/generate"), ("completions", "/v1/completions"), ("chat", "/v1/chat/completions")]


@pytest.mark.parametrize("api", list(DIALECTS))
@pytest.mark.parametrize("constraint", [{}, {"regex": "a+"}, {"json_schema": '{"type":"object"}'}])
def test_a_body_reads_back_as_the_sampling_it_was_built_from(api, constraint):
    d = DIALECTS[api]
    sent = SamplingParams(max_new_tokens=7, temperature=0.5, top_p=0.9, top_k=20, stop=("\n\n",), seed=11,
                          return_logprobs=True, **constraint)
    body = d.body(PROMPTS[api], sent, server="sglang", chat_kwargs={"enable_thinking": False})
    request = d.read(orjson.dumps(body), Bounds(vocab_size=100))
    assert request.params() == sent
    assert d.prompt_of(request) == PROMPTS[api]
    if api == "chat":
        assert request.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("api,prompt,words", [
    ("sglang", MESSAGES, "use api='chat'"), ("completions", MESSAGES, "use api='chat'"),
    ("chat", "<|im_start|>user\nx", "renders the chat template"), ("chat", [1, 2], "token ids")])
def test_a_prompt_kind_the_format_does_not_take_is_refused(api, prompt, words):
    with pytest.raises(ValueError, match=words):
        DIALECTS[api].body(prompt, SamplingParams(max_new_tokens=4))


@pytest.mark.parametrize("api", list(DIALECTS))
def test_a_reply_reads_back_as_the_completion_it_was_written_from(api):
    d = DIALECTS[api]
    comp = Completion(text="ab", token_ids=[97, 98], logprobs=[-0.5, -0.25], finish_reason="length", prompt_tokens=3)
    reply = d.reply(comp, model="m", logprobs=True, token_text=chr, token_ids=True)
    back = d.completion(orjson.loads(orjson.dumps(reply)), SamplingParams(max_new_tokens=2, return_logprobs=True),
                        where="here")
    assert (back.text, back.token_ids, back.logprobs, back.finish_reason, back.prompt_tokens) == (
        "ab", [97, 98], [-0.5, -0.25], "length", 3)


@pytest.mark.parametrize("api", list(DIALECTS))
def test_an_empty_reply_is_the_workers_fault(api):
    with pytest.raises(BackendError, match=f"here: the reply is not a {api} completion") as error:
        DIALECTS[api].completion(DIALECTS[api].empty_reply(), SamplingParams(max_new_tokens=2), where="here")
    assert error.value.retryable
    with pytest.raises(BackendError, match="the reply is not a") as error:  # pydantic's several-line error
        DIALECTS[api].completion({"text": 5, "choices": 5}, SamplingParams(max_new_tokens=2), where="here")
    assert "\n" not in str(error.value)  # `parser ask` ends on it in one line


def test_the_engine_takes_the_generate_body_with_its_constraint():
    body = SGLANG.body("hi", SamplingParams(max_new_tokens=4, stop=("x",), regex="a+"))
    kwargs = SGLANG.engine_kwargs(body)
    assert kwargs["prompt"] == "hi" and "text" not in kwargs and kwargs["return_logprob"] is True
    assert kwargs["sampling_params"]["regex"] == "a+" and kwargs["sampling_params"]["stop"] == ["x"]
    assert body["sampling_params"]["stop"] == ("x",)  # the HTTP body is left as it was


def test_scoring_bodies_read_back_and_chat_refuses_to_score():
    request = SGLANG.read(orjson.dumps(SGLANG.scoring_body([1, 2, 3], 1, server="sglang", temperature=1.0)), Bounds())
    assert (request.input_ids, request.logprob_start_len, request.sampling_params.max_new_tokens) == ([1, 2, 3], 1, 0)
    echo = COMPLETIONS.read(orjson.dumps(COMPLETIONS.scoring_body([1, 2, 3], 1, server="generic", temperature=1.0)), Bounds())
    assert (echo.prompt, echo.echo, echo.max_new()) == ([1, 2, 3], True, 0)
    with pytest.raises(BackendError, match="scores no given tokens") as error:
        CHAT.scoring_body([1, 2], 0, server="vllm", temperature=1.0)
    assert not error.value.retryable


class AbortingEngine:
    async def async_generate(self, **kwargs):
        return ABORT


def test_an_abort_means_the_same_over_http_and_from_the_engine():
    """One policy (`MetaInfo.finish_kind`): retryable whatever its status, the status and message kept."""
    app = web.Application()
    app.router.add_post(SGLANG.path, lambda request: json_response(ABORT))
    sampling = SamplingParams(max_new_tokens=4)
    errors = []
    with ServerHandle(app) as server:
        for backend in (HttpBackend(server.url), SGLangEngineBackend(engine=AbortingEngine(), tokenizer=object())):
            with pytest.raises(BackendError, match="request aborted by the server: out of memory") as error:
                asyncio.run(backend.generate([1, 2], sampling))
            errors.append((error.value.retryable, error.value.status))
            if isinstance(backend, HttpBackend):
                asyncio.run(backend.aclose())
    assert errors == [(True, 400), (True, 400)]
