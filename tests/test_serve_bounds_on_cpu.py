"""parser.serving.server answers a malformed request with a 4xx naming the field, bounds what a request
may hold (the time its header and body may take, its size, its stop list), and tells the truth
about what it serves: unknown models are vLLM's 404, OpenAI fields it does not implement are
refused by name, and the context it advertises is the model's own.

    .venv/bin/pytest tests/test_serve_bounds_on_cpu.py -q

The real server over the tiny random-weight Qwen3.5 and the in-process BPE tokenizer, on a
thread of this process; slow clients are raw sockets.
"""
from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time

import aiohttp
import pytest
from aiohttp import web

from parser.serving.types import BackendError, SamplingParams
from parser.serving.backends.http import HttpBackend
from parser.serving.backends.transformers import TransformersBackend
from parser.serving.server import MAX_REQUEST_BYTES, ModelServer, ServerHandle, ServerLimits, start_server
from parser.serving.wire.common import MAX_SCHEMA_DEPTH

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "Who wrote the letter?"}]


@pytest.fixture(scope="module")
def server(tiny_qwen3_5_model, tiny_tokenizer):
    backend = TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer)
    with start_server(backend, tokenizer=tiny_tokenizer, limits=ServerLimits(body_timeout_s=1, idle_timeout_s=1)) as handle:
        yield handle


def post(url: str, raw_json: str) -> tuple[int, dict]:
    """POST a JSON text as it is (stdlib json: integers past 64 bits, which orjson cannot write)."""
    async def go():
        async with aiohttp.ClientSession() as session:
            async with session.post(url, data=raw_json, headers={"Content-Type": "application/json"}) as r:
                return r.status, await r.json(content_type=None)

    return asyncio.run(go())


@pytest.mark.parametrize("path, body, field", [
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": "x"}}, "response_format.json_schema: expected an object"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": "x"}, "structured_outputs: expected an object"),
    ("/v1/completions", {"prompt": "x", "response_format": 7}, "response_format: expected an object"),
    ("/generate", {"text": "x", "sampling_params": {"json_schema": 5}}, "sampling_params.json_schema: expected an object or a JSON string"),
    ("/generate", {"text": "x", "sampling_params": {"regex": ["a"]}}, "regex: expected a string"),
    ("/generate", {"text": "x", "sampling_params": {"sampling_seed": 2**70}}, "sampling_params.sampling_seed: must fit in 64 bits"),
    ("/v1/completions", {"prompt": "x", "seed": 2**64}, "/v1/completions.seed: must fit in 64 bits"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "seed": -(2**64)}, "seed: must fit in 64 bits"),
    ("/generate", {"text": "x", "sampling_params": []}, "sampling_params: expected an object"),
    ("/generate", {"text": "x", "sampling_params": {"stop": [""]}}, "sampling_params.stop[0]: an empty stop string"),
    ("/generate", {"text": "x", "sampling_params": {"stop": [f"zq{i}" for i in range(17)]}}, "17 stop strings; at most 16"),
    ("/v1/completions", {"prompt": "x", "stop": "y" * 257}, "/v1/completions.stop[0]: 257 characters; at most 256"),
])
def test_malformed_requests_are_400s_naming_the_field(server, path, body, field):
    """Each of these was a 500 (which clients and routers retry) or was accepted."""
    status, out = post(server.url + path, json.dumps(body))
    assert status == 400 and field in out["error"]["message"], out


def test_a_top_p_below_float32_resolution_still_samples(server):
    """top_p=1e-300 is 0.0 in float32: the nucleus kept no token and sampling failed (a 500)."""
    status, out = post(server.url + "/generate", json.dumps({"text": "x", "sampling_params": {"top_p": 1e-300, "max_new_tokens": 2}}))
    assert status == 200 and len(out["output_ids"]) == 2


def test_a_stalled_request_header_does_not_hold_the_connection(server):
    with socket.create_connection((server.host, server.port), timeout=10) as conn:
        conn.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")  # ...and never the rest
        started = time.monotonic()
        try:
            reply = conn.recv(1024)  # b"": the server closed it
        except socket.timeout:
            reply = None
        held = time.monotonic() - started
    assert reply == b"" and held < 1 + 3, f"the connection was held {held:.1f} s"


def test_a_trickled_header_is_cut_at_the_idle_timeout(server):
    """A slow client keeps sending one header byte at a time (the timer must not restart)."""
    with socket.create_connection((server.host, server.port), timeout=10) as conn:
        conn.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < 6:
            try:
                conn.sendall(b"X")
                conn.settimeout(0.2)
                if conn.recv(1024) == b"":
                    closed = True
                    break
            except socket.timeout:
                continue
            except OSError:
                closed = True
                break
    assert closed and time.monotonic() - started < 1 + 3


def test_a_body_that_never_arrives_is_a_408(server):
    with socket.create_connection((server.host, server.port), timeout=10) as conn:
        conn.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"text\"")
        started = time.monotonic()
        reply = conn.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in reply
    assert time.monotonic() - started < 1 + 3


def test_the_request_bounds_are_cli_flags():
    """`python -m parser.serving.server --help` lists every ServerLimits field as a flag."""
    out = subprocess.run([sys.executable, "-m", "parser.serving.server", "--help"], capture_output=True, text=True, timeout=120).stdout
    for flag in ("--body-timeout-s", "--idle-timeout-s", "--max-stop-strings", "--max-stop-chars"):
        assert flag in out


@pytest.mark.parametrize("field, value", [("max_stop_strings", 0), ("idle_timeout_s", float("inf")), ("body_timeout_s", -1),
                                          ("body_timeout_s", float("nan")), ("max_stop_chars", 2.5)])
def test_a_request_bound_that_cannot_work_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        ServerLimits(**{field: value})


@pytest.mark.parametrize("argv, said", [
    (["--port", "-1"], "argument --port: -1: expected an integer in [0, 65535]"),
    (["--port", "65536"], "argument --port: 65536: expected an integer in [0, 65535]"),
    (["--context-length", "0"], "argument --context-length: 0: expected an integer >= 1"),
    (["--body-timeout-s", "nan"], "argument --body-timeout-s: nan: expected a finite number > 0"),
    (["--idle-timeout-s", "inf"], "argument --idle-timeout-s: inf: expected a finite number > 0"),
    (["--max-stop-strings", "-3"], "argument --max-stop-strings: -3: expected an integer >= 1"),
    (["--max-stop-chars", "1.5"], "argument --max-stop-chars: '1.5' is not an integer"),
    (["--body-timeout-s", "1e309"], "argument --body-timeout-s: 1e309: expected a finite number > 0"),
    (["--port", "0x10"], "argument --port: '0x10' is not an integer"),
])
def test_serve_refuses_a_flag_outside_its_domain_before_the_model_loads(argv, said, capsys, monkeypatch):
    """Issue 55 item 5: `--port -1` failed after the model loaded, `--body-timeout-s nan` with a traceback.
    A flag has no null (leaving it out is the default), so its domain is said without one."""
    import parser.serving.server as server_module

    monkeypatch.setattr(server_module, "build_backend", lambda *_: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as ended:
        server_module.main(argv)
    err = capsys.readouterr().err
    assert ended.value.code == 2 and said in err and "null" not in err, err


# ---------------------------------------------------------------------- client errors found by probes, and the truth
def nested(depth: int) -> dict:
    """An object schema `depth` properties deep (2 * depth - 1 JSON levels)."""
    schema: dict = {"type": "object"}
    for _ in range(depth - 1):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("path, body, field", [
    # echo without logprobs still checks the prompt's ids (they were decoded unchecked: 500, or 200 past the vocabulary)
    ("/v1/completions", {"prompt": [5, -1], "echo": True, "max_tokens": 0}, "prompt[1]: token id -1 is outside"),
    ("/v1/completions", {"prompt": [2**63 - 1], "echo": True, "max_tokens": 0}, "prompt[0]: token id 9223372036854775807"),
    ("/v1/completions", {"prompt": [[3, 10**6]], "echo": True, "max_tokens": 0}, "prompt[1]: token id 1000000 is outside"),
    # a seed past 64 bits was read as a float, rounded into range and accepted
    ("/v1/completions", {"prompt": "x", "seed": -(2**63) - 1}, "/v1/completions.seed: must fit in 64 bits"),
    ("/generate", {"text": "x", "sampling_params": {"sampling_seed": -(2**63) - 1}}, "sampling_seed: must fit in 64 bits"),
    ("/v1/completions", {"prompt": "x", "seed": 7.5}, "seed: must fit in 64 bits"),
    # a schema deeper than the encoder writes was a 500; one past the bound is named
    ("/generate", {"text": "x", "sampling_params": {"json_schema": nested(300)}}, "/generate: body is not JSON: recursion limit"),
    ("/generate", {"text": "x", "sampling_params": {"json_schema": nested(MAX_SCHEMA_DEPTH + 1)}}, f"nested more than {MAX_SCHEMA_DEPTH}"),
    (CHAT, {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"schema": nested(MAX_SCHEMA_DEPTH // 2 + 1)}}},
     "response_format.json_schema.schema: nested more than"),
    ("/generate", {"text": "x", "sampling_params": {"json_schema": "{not json"}}, "json_schema: a JSON string that does not parse"),
])
def test_client_errors_are_400s_naming_the_field(server, path, body, field):
    status, out = post(server.url + path, json.dumps(body))
    assert status == 400 and field in out["error"]["message"], out


@pytest.mark.parametrize("body, named", [
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"messages": USER, "tool_choice": "required", "logit_bias": {"5": 10}}, "logit_bias, tool_choice"),
    ({"messages": USER, "logprobs": True, "top_logprobs": 3}, "top_logprobs=3"),
    ({"messages": USER, "presence_penalty": 0.5}, "presence_penalty"),
])
def test_openai_fields_that_are_not_implemented_are_refused_by_name(server, body, named):
    """They were silently ignored: the answer looked as if the server had honoured them."""
    status, out = post(server.url + CHAT, json.dumps(body))
    assert status == 400 and named in out["error"]["message"] and "not implemented" in out["error"]["message"], out


@pytest.mark.parametrize("path, body, field", [
    # stop ids were ignored unread: one past the vocabulary can never be generated (issue 55, item 9)
    ("/generate", {"text": "x", "sampling_params": {"stop_token_ids": [10**6]}}, "sampling_params.stop_token_ids[0]: token id 1000000 is outside"),
    ("/generate", {"text": "x", "sampling_params": {"stop_token_ids": [3, -1]}}, "stop_token_ids[1]: token id -1 is outside"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [2**63]}, "/v1/completions.stop_token_ids[0]: token id"),
    (CHAT, {"messages": USER, "stop_token_ids": [0, 151936]}, "stop_token_ids[1]: token id 151936 is outside the vocabulary"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [True]}, "stop_token_ids: expected a list of integer token ids"),
    ("/generate", {"text": "x", "sampling_params": {"stop_token_ids": 5}}, "stop_token_ids: expected a list of integer token ids"),
    ("/generate", {"text": "x", "sampling_params": {"stop_token_ids": ["5"]}}, "stop_token_ids: expected a list of integer token ids"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [1.0]}, "stop_token_ids: expected a list of integer token ids, got [1.0]"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [[1]]}, "stop_token_ids: expected a list of integer token ids, got [[1]]"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [10**30]}, "stop_token_ids[0]: token id 1000000000000000000000000000000 is outside"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": list(range(300))}, "300 distinct stop token ids; at most 256"),
])
def test_stop_token_ids_outside_the_vocabulary_are_400s(server, path, body, field):
    status, out = post(server.url + path, json.dumps(body))
    assert status == 400 and field in out["error"]["message"], out


def test_a_stop_token_id_in_the_vocabulary_ends_generation(server):
    """Greedy, so the first token is the same both times: given as a stop id, it ends the request at once."""
    def generate(stop_ids):
        body = {"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0, "return_token_ids": True, "stop_token_ids": stop_ids}
        status, out = post(server.url + "/v1/completions", json.dumps(body))
        return status, out["choices"][0]["token_ids"], out["choices"][0]["finish_reason"]

    status, ids, _ = generate([])
    assert status == 200 and ids
    status, stopped, reason = generate([ids[0]])
    assert status == 200 and reason == "stop" and len(stopped) <= 1, (stopped, reason)
    sglang = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4, "temperature": 0, "stop_token_ids": [ids[0]]}}
    status, out = post(server.url + "/generate", json.dumps(sglang))
    assert status == 200 and out["meta_info"]["finish_reason"]["type"] == "stop" and out["meta_info"]["completion_tokens"] <= 1, out


def test_completions_top_k_logprobs_are_refused(server):
    status, out = post(server.url + "/v1/completions", json.dumps({"prompt": "x", "logprobs": 2}))
    assert status == 400 and "logprobs=2: the top-k alternatives are not implemented" in out["error"]["message"]


def test_neutral_values_of_those_fields_are_accepted(server):
    body = {"messages": USER, "max_tokens": 2, "tools": [], "tool_choice": "none", "presence_penalty": 0, "n": 1,
            "user": "someone", "model": "default"}
    assert post(server.url + CHAT, json.dumps(body))[0] == 200


def test_json_object_is_decoded_under_a_json_grammar(server):
    """response_format json_object was ignored; it now constrains decoding as vLLM's JSON grammar does."""
    body = {"messages": USER, "max_tokens": 6, "temperature": 0, "response_format": {"type": "json_object"}}
    status, out = post(server.url + CHAT, json.dumps(body))
    text = out["choices"][0]["message"]["content"]
    assert status == 200 and text.lstrip().startswith("{"), text


def test_another_model_name_is_vllms_404(server):
    status, out = post(server.url + CHAT, json.dumps({"model": "gpt-4o", "messages": USER}))
    assert status == 404 and out["error"] == {"message": "The model `gpt-4o` does not exist.", "type": "NotFoundError",
                                              "code": 404, "param": "model"}

    async def go():
        async with HttpBackend(server.url, api="completions", model="gpt-4o") as backend:
            await backend.generate("x", SamplingParams(max_new_tokens=1))

    with pytest.raises(BackendError, match="does not exist") as error:
        asyncio.run(go())
    assert error.value.retryable is False and error.value.status == 404


def test_a_declared_body_over_the_bound_is_a_413_before_it_is_read(server):
    """It waited for the body timeout and then answered 408."""
    with socket.create_connection((server.host, server.port), timeout=20) as conn:
        conn.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n{" % (MAX_REQUEST_BYTES + 1))
        reply = conn.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413") and b"not read" in reply, reply[:200]


def test_a_request_counts_as_in_flight_only_once_its_body_is_read(tiny_qwen3_5_model, tiny_tokenizer):
    """A client that sends headers and never its body is not load (the router would route around it)."""
    entered = threading.Event()

    @web.middleware
    async def mark(request, handler):
        if request.path == "/generate":
            entered.set()  # the handler runs next, on this loop, until it waits for the body
        return await handler(request)

    server = ModelServer(TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer), tokenizer=tiny_tokenizer)
    app = server.app()
    app.middlewares.append(mark)
    with ServerHandle(app) as handle, socket.create_connection((handle.host, handle.port), timeout=20) as conn:
        conn.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        assert entered.wait(20)

        async def load():
            async with aiohttp.ClientSession() as session, session.get(handle.url + "/get_load") as r:
                return await r.json()

        assert asyncio.run(load())[0]["num_reqs"] == 0


def test_the_advertised_context_is_the_models_own(tiny_tokenizer):
    """It was 32768 whatever the model; a context over the model's positions is refused."""
    from parser.offline import tiny_qwen3

    backend = TransformersBackend(tiny_qwen3(tiny_tokenizer, max_position_embeddings=4096), tiny_tokenizer)
    with start_server(backend, tokenizer=tiny_tokenizer, model_name="short") as handle:
        async def info():
            async with aiohttp.ClientSession() as session:
                async with session.get(handle.url + "/v1/models") as r:
                    models = await r.json()
                async with session.get(handle.url + "/get_model_info") as r:
                    return models, await r.json()

        models, model_info = asyncio.run(info())
    assert models["data"][0]["max_model_len"] == 4096 == model_info["max_context_length"]
    with pytest.raises(ValueError, match="over the model's max_position_embeddings 4096"):
        ModelServer(backend, tokenizer=tiny_tokenizer, context_length=8192)
