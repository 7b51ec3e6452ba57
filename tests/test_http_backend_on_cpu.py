"""HttpBackend against real HTTP servers on 127.0.0.1 (no model: the loopback worker, and a
capture server that answers with recorded SGLang / OpenAI bodies).

    .venv/bin/pytest tests/test_http_backend_on_cpu.py -q
"""
from __future__ import annotations

import asyncio
import socket
import threading
import time

import aiohttp
import orjson
import pytest
from aiohttp import web

from parser.base.redact import redact
from parser.serving.types import ROUTING_HEADER, Backend, BackendError, SamplingParams
from parser.serving.backends.http import HttpBackend
from parser.serving.server import ServerHandle, json_response
from parser.serving.loopback import ABSTENTION, prefix_hash, start_loopback

NEEDLE = "The harbour master moved to Tromso in 1911."
SP = SamplingParams(max_new_tokens=8, temperature=0.0)


def run(coro):
    return asyncio.run(coro)


async def generate_once(backend: HttpBackend, *args, **kwargs):
    try:
        return await backend.generate(*args, **kwargs)
    finally:
        await backend.aclose()


@pytest.fixture(scope="module")
def loopback():
    with start_loopback("w1", needle=NEEDLE, needle_answer="Tromso") as handle:
        yield handle


@pytest.fixture
def fresh_loopback():
    with start_loopback("w-faulty") as handle:
        yield handle


class Capture:
    """A server that records each request and answers with the next canned (status, body)."""

    def __init__(self):
        self.requests: list[dict] = []
        self.replies: list[tuple[int, object]] = []

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.requests.append({"path": request.path, "headers": dict(request.headers),
                              "body": orjson.loads(raw) if raw else None})
        status, body = self.replies.pop(0)
        if isinstance(body, bytes):
            return web.Response(body=body, status=status)
        return json_response(body, status)


@pytest.fixture
def capture():
    cap = Capture()
    app = web.Application()
    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
        app.router.add_post(path, cap.handle)
    app.router.add_get("/v1/models", cap.handle)
    with ServerHandle(app) as handle:
        cap.url = handle.url
        yield cap


def test_is_a_backend():
    assert isinstance(HttpBackend("http://127.0.0.1:1"), Backend)
    with pytest.raises(ValueError, match="api="):
        HttpBackend("http://127.0.0.1:1", api="grpc")


# ---------------------------------------------------------------------- the three APIs
@pytest.mark.parametrize("api", ["sglang", "completions", "chat"])
def test_roundtrip_routing_header_and_worker(loopback, api):
    prompt = f"Read this.\n<excerpt>\n{NEEDLE}\n</excerpt>\n\nQuery: where did he move?"
    sent = [{"role": "user", "content": prompt}] if api == "chat" else prompt  # a chat server renders the template
    out = run(generate_once(HttpBackend(loopback.url, api=api, model="m"), sent, SP,
                            routing_key=f"doc7:{api}", request_id="traj-1"))
    assert orjson.loads(out.text) == {"evidence": NEEDLE, "answer": "Tromso"}
    assert out.worker == "w1" and out.finish_reason == "stop"
    rec = next(r for r in loopback.worker.records if r.routing_key == f"doc7:{api}")
    assert rec.request_id == "traj-1" and rec.worker_id == "w1"
    if api != "chat":  # text prompts: the cacheable prefix is everything before "Query:"
        assert rec.prefix_hash == prefix_hash(prompt.split("Query:")[0] + "Query: other")


def test_sglang_token_ids_and_logprobs(loopback):
    out = run(generate_once(HttpBackend(loopback.url), [1, 2, 3, 4, 5],
                            SamplingParams(max_new_tokens=8, return_logprobs=True)))
    assert out.text == ABSTENTION
    assert out.token_ids == list(ABSTENTION.encode())  # the loopback's byte-level "tokens"
    assert out.logprobs == [0.0] * len(out.token_ids)
    assert out.prompt_tokens == 5


def test_routing_header_name_is_configurable(loopback):
    backend = HttpBackend(loopback.url, routing_header="X-SMG-Routing-Key")
    loopback.worker.routing_header = "X-SMG-Routing-Key"
    try:
        run(generate_once(backend, "hello", SP, routing_key="doc9:4"))
    finally:
        loopback.worker.routing_header = ROUTING_HEADER
    assert loopback.worker.records[-1].routing_key == "doc9:4"


# ---------------------------------------------------------------------- wire format
def test_sglang_request_and_response_shape(capture):
    capture.replies.append((200, {
        "text": " Paris", "output_ids": [12095],
        "meta_info": {"id": "x", "finish_reason": {"type": "length", "length": 1},
                      "prompt_tokens": 7, "completion_tokens": 1, "cached_tokens": 5,
                      "output_token_logprobs": [[-0.25, 12095, None]], "e2e_latency": 0.1}}))
    sp = SamplingParams(max_new_tokens=1, temperature=0.7, top_p=0.9, top_k=20,
                        stop=("\n",), seed=3, return_logprobs=True)
    out = run(generate_once(HttpBackend(capture.url, headers={"Authorization": "Bearer k"}),
                            "Capital of France?", sp, routing_key="d:0"))
    req = capture.requests[0]
    assert req["path"] == "/generate" and req["headers"]["Authorization"] == "Bearer k"
    assert req["body"] == {"text": "Capital of France?", "return_logprob": True, "sampling_params": {
        "max_new_tokens": 1, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "stop": ["\n"],
        "sampling_seed": 3}}
    assert (out.text, out.token_ids, out.logprobs) == (" Paris", [12095], [-0.25])
    assert (out.finish_reason, out.prompt_tokens, out.cached_tokens) == ("length", 7, 5)
    assert out.worker is None  # the server did not say


def test_sglang_ids_from_logprob_triples_when_no_output_ids(capture):
    capture.replies.append((200, {"text": "ab", "meta_info": {
        "finish_reason": {"type": "stop", "matched": 151645}, "prompt_tokens": 2,
        "output_token_logprobs": [[-1.0, 64, "a"], [-2.0, 65, "b"]]}}))
    out = run(generate_once(HttpBackend(capture.url), [9, 9],
                            SamplingParams(max_new_tokens=2, return_logprobs=True)))
    assert capture.requests[0]["body"]["input_ids"] == [9, 9]
    assert (out.token_ids, out.logprobs, out.finish_reason) == ([64, 65], [-1.0, -2.0], "stop")


def test_sglang_abort_is_a_backend_error(capture):
    capture.replies.append((200, {"text": "", "meta_info": {"finish_reason": {
        "type": "abort", "message": "the scheduler aborted the request", "status_code": 400}}}))
    with pytest.raises(BackendError, match="scheduler aborted") as err:
        run(generate_once(HttpBackend(capture.url), "x", SP))
    assert err.value.retryable is True and err.value.status == 400  # the worker gave up on a request it took


def test_completions_shape_and_cached_tokens(capture):
    capture.replies.append((200, {"choices": [{"index": 0, "text": "ok", "finish_reason": "length",
                                               "logprobs": {"token_logprobs": [-0.5, -0.1]}}],
                                  "usage": {"prompt_tokens": 11, "completion_tokens": 2,
                                            "prompt_tokens_details": {"cached_tokens": 8}}}))
    sp = SamplingParams(max_new_tokens=2, seed=1, return_logprobs=True)
    out = run(generate_once(HttpBackend(capture.url, api="completions", model="qwen"), [5, 6], sp))
    body = capture.requests[0]["body"]
    assert body["prompt"] == [5, 6] and body["model"] == "qwen" and body["max_tokens"] == 2
    assert body["logprobs"] == 0 and body["seed"] == 1 and "top_k" not in body
    assert (out.text, out.logprobs, out.finish_reason) == ("ok", [-0.5, -0.1], "length")
    assert (out.prompt_tokens, out.cached_tokens) == (11, 8)


def test_chat_messages_and_template_kwargs(capture):
    capture.replies.append((200, {"choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": "hi"}}],
                                  "usage": {"prompt_tokens": 4}}))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    backend = HttpBackend(capture.url, api="chat", model="m",
                          chat_template_kwargs={"enable_thinking": False})
    out = run(generate_once(backend, messages, SP))
    body = capture.requests[0]["body"]
    assert body["messages"] == messages
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert out.text == "hi" and out.prompt_tokens == 4 and out.logprobs is None


def test_prompt_kind_must_fit_the_api():
    with pytest.raises(ValueError, match="api='chat'"):
        run(generate_once(HttpBackend("http://127.0.0.1:1"), [{"role": "user", "content": "x"}], SP))
    with pytest.raises(ValueError, match="token ids"):
        run(generate_once(HttpBackend("http://127.0.0.1:1", api="chat"), [1, 2], SP))


# ---------------------------------------------------------------------- failures
def test_http_500_is_retryable(fresh_loopback):
    fresh_loopback.worker.fail_first = 1
    backend = HttpBackend(fresh_loopback.url)

    async def two_calls():
        with pytest.raises(BackendError, match="injected failure") as err:
            await backend.generate("x", SP)
        assert err.value.retryable is True and err.value.status == 500
        return await backend.generate("x", SP)  # the engine's retry: the next call succeeds

    assert run(generate_once_after(backend, two_calls())).text == ABSTENTION


async def generate_once_after(backend: HttpBackend, coro):
    try:
        return await coro
    finally:
        await backend.aclose()


def test_http_400_is_not_retryable_and_keeps_the_message(capture):
    capture.replies.append((400, {"object": "error", "error": {
        "message": "max_new_tokens must be positive", "code": 400}}))
    with pytest.raises(BackendError, match="max_new_tokens must be positive") as err:
        run(generate_once(HttpBackend(capture.url), "x", SP))
    assert err.value.retryable is False and err.value.status == 400


@pytest.mark.parametrize("status", [429, 503])
def test_overload_statuses_are_retryable(capture, status):
    capture.replies.append((status, b"queue full"))
    with pytest.raises(BackendError, match="queue full") as err:
        run(generate_once(HttpBackend(capture.url), "x", SP))
    assert err.value.retryable is True and err.value.status == status


def test_garbled_body_is_retryable(capture):
    capture.replies.append((200, b"<html>proxy error</html>"))
    with pytest.raises(BackendError, match="not JSON") as err:
        run(generate_once(HttpBackend(capture.url), "x", SP))
    assert err.value.retryable is True


def test_dropped_connection_is_retryable(fresh_loopback):
    fresh_loopback.worker.fail_first = 1
    fresh_loopback.worker.fail_mode = "drop"
    with pytest.raises(BackendError, match="Disconnected") as err:
        run(generate_once(HttpBackend(fresh_loopback.url), "x", SP))
    assert err.value.retryable is True and err.value.status is None


def test_connection_refused_is_retryable():
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BackendError, match="Connect") as err:
        run(generate_once(HttpBackend(f"http://127.0.0.1:{port}"), "x", SP))
    assert err.value.retryable is True


def test_a_failed_request_names_the_host_and_port_but_never_the_password():
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = HttpBackend(f"http://ann:s3cret@127.0.0.1:{port}", api="completions", model="m")
    with pytest.raises(BackendError, match=rf"POST http://ann:\*\*\*@127\.0\.0\.1:{port}/v1/completions: ") as err:
        run(generate_once(backend, "x", SP))
    assert "s3cret" not in str(err.value)


@pytest.mark.parametrize("text,shown", [
    ("GET http://ann:s3cret@gpu1:8000/v1/models: refused", "GET http://ann:***@gpu1:8000/v1/models: refused"),
    ("https://TOKEN@host/health", "https://***@host/health"),  # a token passed as the user name
    ("http://ann:p@ss@host:80/x", "http://ann:***@host:80/x"),  # a bare `@` in the password, as urllib splits it
    ("['http://a:1@h1', 'http://b:2@h2']", "['http://a:***@h1', 'http://b:***@h2']"),
    ("http://host:80/path?mail=a@b, and a@b.c", "http://host:80/path?mail=a@b, and a@b.c"),  # no userinfo: unchanged
])
def test_redact_masks_the_password_of_every_url_in_a_message(text, shown):
    assert redact(text) == shown == redact(shown)


def test_timeout_is_retryable_and_prompt(fresh_loopback):
    fresh_loopback.worker.delay_s = 1.0
    t0 = time.perf_counter()
    with pytest.raises(BackendError, match="within 0.3s") as err:
        run(generate_once(HttpBackend(fresh_loopback.url, timeout_s=0.3), "x", SP))
    assert err.value.retryable is True
    assert time.perf_counter() - t0 < 0.9


def test_failed_requests_give_their_connections_back(fresh_loopback):
    """With a pool of 2 connections, 40 failures then 40 successes must not starve the pool."""
    fresh_loopback.worker.fail_first = 40
    backend = HttpBackend(fresh_loopback.url, max_connections=2, timeout_s=10)

    async def scatter():
        first = await asyncio.gather(*(backend.generate("x", SP) for _ in range(40)),
                                     return_exceptions=True)
        second = await asyncio.gather(*(backend.generate("x", SP) for _ in range(40)))
        return first, second

    first, second = run(asyncio.wait_for(generate_once_after(backend, scatter()), 20))
    assert all(isinstance(e, BackendError) and e.status == 500 for e in first)
    assert [c.text for c in second] == [ABSTENTION] * 40


def test_one_backend_across_event_loops(loopback):
    """The session binds to a loop; a second asyncio.run must get a fresh one, not an error."""
    backend = HttpBackend(loopback.url)
    assert run(backend.generate("a", SP)).text == ABSTENTION
    assert run(generate_once(backend, "b", SP)).text == ABSTENTION


def test_loopback_reports_load_while_busy(fresh_loopback):
    """The router's load probe (/get_load) sees a request that is still being answered: the
    worker holds it in flight until the probe has answered."""
    worker = fresh_loopback.worker
    worker.hold = threading.Event()
    backend = HttpBackend(fresh_loopback.url)

    async def probe_during_request():
        task = asyncio.create_task(backend.generate("x" * 40, SP))
        try:
            assert await asyncio.to_thread(worker.in_flight.wait, 60), "the request never reached the worker"
            async with aiohttp.ClientSession() as s:
                async with s.get(fresh_loopback.url + "/get_load") as r:
                    busy = await r.json()
        finally:
            worker.hold.set()
        await task
        async with aiohttp.ClientSession() as s:
            async with s.get(fresh_loopback.url + "/get_load") as r:
                idle = await r.json()
        await backend.aclose()
        return busy, idle

    busy, idle = run(probe_during_request())
    assert busy == [{"dp_rank": 0, "num_reqs": 1, "num_waiting_reqs": 0, "num_tokens": 40}]
    assert idle[0]["num_reqs"] == 0 and idle[0]["num_tokens"] == 0


def test_json_schema_reaches_both_apis(capture):
    """Constrained subagent output: SGLang's sampling_params.json_schema, OpenAI's response_format."""
    from parser.text.chunking import Chunk
    from parser.engine.readers import SubagentReader
    from parser.offline import byte_bpe_tokenizer

    reader = SubagentReader(HttpBackend(capture.url), byte_bpe_tokenizer(), json_constrained=True)
    capture.replies.append((200, {"text": '{"answer": "unknown"}', "meta_info": {"finish_reason": {"type": "stop"}}}))
    run(reader.read("Who?", Chunk(0, "text", (1,), 1), "d"))
    schema = capture.requests[-1]["body"]["sampling_params"]["json_schema"]
    assert list(orjson.loads(schema)["properties"]) == ["answer", "evidence"]  # a cut reply keeps its answer

    capture.replies.append((200, {"choices": [{"index": 0, "text": "{}", "finish_reason": "stop"}]}))
    sp = SamplingParams(max_new_tokens=4, json_schema=schema)
    run(generate_once(HttpBackend(capture.url, api="completions", model="m"), "x", sp))
    fmt = capture.requests[-1]["body"]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"]["properties"]["answer"]["type"] == "string"


# ---------------------------------------------------------------------- servers other than SGLang
def test_model_name_is_discovered_once_from_v1_models(capture):
    capture.replies += [(200, {"object": "list", "data": [{"id": "HuggingFaceTB/SmolLM2-135M-Instruct"}]}),
                        *[(200, {"choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]})] * 2]
    backend = HttpBackend(capture.url, api="completions", server="vllm")

    async def two():
        try:
            return [await backend.generate("x", SP), await backend.generate("y", SP)]
        finally:
            await backend.aclose()

    run(two())
    assert [r["path"] for r in capture.requests] == ["/v1/models", "/v1/completions", "/v1/completions"]
    assert capture.requests[1]["body"]["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert capture.requests[1]["body"]["return_token_ids"] is True


def test_no_served_model_is_a_configuration_error(capture):
    capture.replies.append((200, {"object": "list", "data": []}))
    with pytest.raises(BackendError, match="no served model") as err:
        run(generate_once(HttpBackend(capture.url, api="chat"), [{"role": "user", "content": "x"}], SP))
    assert err.value.retryable is False


def test_vllm_token_ids_and_aligned_logprobs(capture):
    """vLLM's reply with return_token_ids: the ids include the <|im_end|> that ended the turn,
    one logprob each (the text does not show it, which is why re-tokenising text cannot work)."""
    capture.replies.append((200, {"choices": [{"index": 0, "text": "<answer>Tromso</answer>", "finish_reason": "stop",
                                               "token_ids": [27, 9, 2], "logprobs": {"token_logprobs": [-0.1, -0.2, -0.3]}}]}))
    out = run(generate_once(HttpBackend(capture.url, api="completions", server="vllm", model="m"), [1, 2],
                            SamplingParams(max_new_tokens=4, return_logprobs=True)))
    assert out.token_ids == [27, 9, 2] and out.logprobs == [-0.1, -0.2, -0.3]


def test_chat_sends_the_subagent_messages_not_rendered_text(capture):
    from parser.text.chunking import Chunk
    from parser.engine.readers import SubagentReader
    from parser.offline import byte_bpe_tokenizer

    capture.replies.append((200, {"choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": '{"answer": "unknown"}'}}]}))
    reader = SubagentReader(HttpBackend(capture.url, api="chat", model="m"), byte_bpe_tokenizer())
    run(reader.read("Who?", Chunk(0, "The excerpt.", (1,), 3), "d"))
    (message,) = capture.requests[0]["body"]["messages"]
    assert message["role"] == "user" and message["content"].startswith("Answer the query using only the excerpt")
    assert "<|im_start|>" not in message["content"]  # the server applies the template, once
    with pytest.raises(ValueError, match="renders the chat template"):
        run(generate_once(HttpBackend(capture.url, api="chat", model="m"), "<|im_start|>user\nx<|im_end|>\n", SP))


@pytest.mark.parametrize("server,header_sent", [("sglang", True), ("vllm", True), ("generic", False)])
def test_request_id_header_defaults_per_server(capture, server, header_sent):
    """llama.cpp answers 400 to an X-Request-Id that is not a UUID, so `generic` sends none."""
    capture.replies.append((200, {"choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]}))
    run(generate_once(HttpBackend(capture.url, api="completions", server=server, model="m"), "x", SP,
                      request_id="doc-7", routing_key="doc-7:0"))
    headers = {k.lower(): v for k, v in capture.requests[0]["headers"].items()}
    assert ("x-request-id" in headers) is header_sent and headers[ROUTING_HEADER.lower()] == "doc-7:0"


def test_request_id_header_can_be_turned_off(capture):
    capture.replies.append((200, {"text": "ok", "meta_info": {"finish_reason": {"type": "stop"}}}))
    run(generate_once(HttpBackend(capture.url, request_id_header=None), "x", SP, request_id="doc-7"))
    assert "x-request-id" not in {k.lower() for k in capture.requests[0]["headers"]}


def test_validation_error_on_a_500_is_not_retried_and_long_messages_are_capped(capture):
    """llama.cpp's answer to an over-long prompt: HTTP 500 with a validation error type and, once,
    1.1 MB of text."""
    message = "the request exceeds the available context size " + "x" * 1_100_000
    capture.replies.append((500, {"error": {"code": 500, "message": message, "type": "exceed_context_size_error"}}))
    with pytest.raises(BackendError) as err:
        run(generate_once(HttpBackend(capture.url, api="completions", server="generic", model="m"), "x", SP))
    assert err.value.retryable is False and err.value.status == 500
    assert len(str(err.value)) < 700 and "1100047 chars" in str(err.value)


def test_empty_400_body_says_so(capture):
    capture.replies.append((400, b""))
    with pytest.raises(BackendError, match="empty body") as err:
        run(generate_once(HttpBackend(capture.url, api="completions", server="generic", model="m"), "x", SP))
    assert err.value.retryable is False


@pytest.mark.parametrize("server,kind,expected", [
    ("vllm", "json_schema", {"structured_outputs": {"json": {"type": "object"}, "disable_any_whitespace": True}}),
    ("vllm", "regex", {"structured_outputs": {"regex": "a+"}}),
    ("sglang", "regex", {"regex": "a+"}),
    ("sglang", "json_schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": {"type": "object"}}}}),
])
def test_constraints_in_each_servers_dialect(capture, server, kind, expected):
    capture.replies.append((200, {"choices": [{"index": 0, "text": "a", "finish_reason": "stop"}]}))
    sp = SamplingParams(max_new_tokens=4, **({"json_schema": '{"type": "object"}'} if kind == "json_schema" else {"regex": "a+"}))
    run(generate_once(HttpBackend(capture.url, api="completions", server=server, model="m"), "x", sp))
    body = capture.requests[0]["body"]
    assert {k: body[k] for k in expected} == expected


def test_generic_servers_refuse_constraints_instead_of_ignoring_them():
    with pytest.raises(BackendError, match="no known way to constrain") as err:
        run(generate_once(HttpBackend("http://127.0.0.1:1", api="completions", server="generic", model="m"), "x",
                          SamplingParams(max_new_tokens=4, regex="a+")))
    assert err.value.retryable is False
