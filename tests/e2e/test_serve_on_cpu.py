"""parser.serving.server with a real tiny model (random-weight Qwen3.5, in-process BPE tokenizer):
SGLang- and OpenAI-shaped JSON with real generated tokens, the prefix cache showing up as
cached_tokens, HttpBackend round trips for all three APIs, field-naming 400s, and the CLI.

    .venv/bin/pytest tests/e2e/test_serve_on_cpu.py -q
"""
from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time

import aiohttp
import orjson
import pytest

from parser.serving.types import BackendError, SamplingParams
from parser.serving.backends.http import HttpBackend
from parser.serving.backends.transformers import TransformersBackend
from parser.serving.server import WORKER_HEADER, start_server

PROMPT = "The lead agent never reads the document. Question: who wrote the letter?"


@pytest.fixture(scope="module")
def tok(tiny_tokenizer):  # conftest: in-process BPE with the real Qwen3.5 chat template
    return tiny_tokenizer


@pytest.fixture(scope="module")
def backend(tiny_qwen3_5_model, tok):
    return TransformersBackend(tiny_qwen3_5_model, tok)


@pytest.fixture(scope="module")
def server(backend, tok):
    with start_server(backend, tokenizer=tok, model_name="tiny-qwen3.5", worker_id="cpu-0") as h:
        yield h


def call(method: str, url: str, body: dict | None = None) -> tuple[int, dict, dict]:
    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.request(method, url, data=None if body is None else orjson.dumps(body)) as r:
                return r.status, dict(r.headers), orjson.loads(await r.read())

    return asyncio.run(go())


def greedy_ids(backend: TransformersBackend, ids: list[int], n: int) -> list[int]:
    """What the model itself generates, outside the server (no prefix cache key shared)."""
    return backend.generate_ids(ids, SamplingParams(max_new_tokens=n, temperature=0.0),
                                key="direct-check").token_ids


# ---------------------------------------------------------------------- SGLang /generate
def test_generate_text_matches_the_model(server, backend, tok):
    status, headers, out = call("POST", server.url + "/generate", {
        "text": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0},
        "return_logprob": True})
    assert status == 200 and headers[WORKER_HEADER] == "cpu-0"
    prompt_ids = tok.encode(PROMPT, add_special_tokens=False)
    assert out["output_ids"] == greedy_ids(backend, prompt_ids, 6)
    assert out["text"] == tok.decode(out["output_ids"], skip_special_tokens=True)
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == len(prompt_ids)
    assert meta["completion_tokens"] == len(out["output_ids"]) <= 6
    reason = meta["finish_reason"]
    assert reason["type"] in ("stop", "length")
    if reason["type"] == "length":
        assert reason["length"] == 6 == len(out["output_ids"])
    triples = meta["output_token_logprobs"]
    assert [t[1] for t in triples] == out["output_ids"]
    assert all(isinstance(t[0], float) and t[0] <= 0.0 for t in triples)
    assert isinstance(meta["cached_tokens"], int)


def test_generate_reports_prefix_cache_hits(server, tok):
    """Rounds that share an instructions+chunk prefix under one routing key reuse it, and
    meta_info.cached_tokens says so (the number the gateway bench reads). On the hybrid
    Qwen3.5 stack the exact boundary is snapshotted on the second round and reused from the
    third (TransformersBackend's documented prefix cache)."""
    prefix = "Answer from the excerpt only.\n<excerpt>\nThe mill burned in 1903.\n</excerpt>\nQuery:"
    backend = HttpBackend(server.url)

    async def rounds():
        sp = SamplingParams(max_new_tokens=2, temperature=0.0)
        try:
            return [await backend.generate(prefix + q, sp, routing_key="doc1:0")
                    for q in (" when?", " what burned?", " where?")]
        finally:
            await backend.aclose()

    first, _, third = asyncio.run(rounds())
    assert first.cached_tokens == 0 and first.worker == "cpu-0"
    common = len(tok.encode(prefix, add_special_tokens=False)) - 1  # last token may merge
    assert third.cached_tokens >= common > 0
    assert third.prompt_tokens > third.cached_tokens


def test_generate_input_ids_and_seeded_sampling(server, tok):
    ids = tok.encode(PROMPT, add_special_tokens=False)
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 5, "temperature": 1.0,
                                                 "top_k": 50, "sampling_seed": 7}}
    _, _, a = call("POST", server.url + "/generate", body)
    _, _, b = call("POST", server.url + "/generate", body)
    assert a["meta_info"]["prompt_tokens"] == len(ids)
    assert a["output_ids"] == b["output_ids"] and len(a["output_ids"]) >= 1


# ---------------------------------------------------------------------- OpenAI endpoints
def test_completions_shape(server, backend, tok):
    status, _, out = call("POST", server.url + "/v1/completions", {
        "model": "tiny-qwen3.5", "prompt": PROMPT, "max_tokens": 4, "temperature": 0,
        "logprobs": 0})
    assert status == 200 and out["object"] == "text_completion"
    choice = out["choices"][0]
    expected = greedy_ids(backend, tok.encode(PROMPT, add_special_tokens=False), 4)
    assert choice["text"] == tok.decode(expected, skip_special_tokens=True)
    assert choice["finish_reason"] in ("stop", "length")
    assert len(choice["logprobs"]["tokens"]) == len(choice["logprobs"]["token_logprobs"]) == len(expected)
    usage = out["usage"]
    assert usage["completion_tokens"] == len(expected)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert "cached_tokens" in usage["prompt_tokens_details"]


def test_chat_renders_template_with_kwargs(server, tok):
    messages = [{"role": "user", "content": "Who wrote the letter?"}]
    counts = {}
    for thinking in (True, False):
        status, _, out = call("POST", server.url + "/v1/chat/completions", {
            "messages": messages, "max_tokens": 3, "temperature": 0, "logprobs": True,
            "chat_template_kwargs": {"enable_thinking": thinking}})
        assert status == 200 and out["object"] == "chat.completion"
        choice = out["choices"][0]
        assert choice["message"]["role"] == "assistant"
        assert isinstance(choice["message"]["content"], str)
        assert len(choice["logprobs"]["content"]) == out["usage"]["completion_tokens"] >= 1
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                           enable_thinking=thinking)
        assert out["usage"]["prompt_tokens"] == len(tok.encode(rendered, add_special_tokens=False))
        counts[thinking] = out["usage"]["prompt_tokens"]
    assert counts[False] > counts[True]  # non-thinking mode pre-fills an empty <think></think>


@pytest.mark.parametrize("api,server_kind", [("sglang", "sglang"), ("completions", "vllm"), ("chat", "vllm"),
                                             ("completions", "generic")])
def test_http_backend_round_trip(server, api, server_kind):
    """No model configured: the name comes from /v1/models. Servers that return token ids
    (SGLang's /generate, vLLM's return_token_ids, which parser.serving.server speaks) give one logprob per id."""
    backend = HttpBackend(server.url, api=api, server=server_kind, chat_template_kwargs={"enable_thinking": False})
    sp = SamplingParams(max_new_tokens=3, temperature=0.0, return_logprobs=True)
    prompt = [{"role": "user", "content": "Who wrote the letter?"}] if api == "chat" else "Who wrote the letter?"

    async def go():
        try:
            return await backend.generate(prompt, sp, routing_key=f"d:{api}")
        finally:
            await backend.aclose()

    out = asyncio.run(go())
    assert out.worker == "cpu-0" and out.prompt_tokens > 0
    assert out.logprobs is not None and 1 <= len(out.logprobs) <= 3
    assert backend.model == ("tiny-qwen3.5" if api != "sglang" else None)
    if server_kind == "generic":
        assert out.token_ids == []  # text only: the engine must re-tokenise, and says so
    else:
        assert len(out.token_ids) == len(out.logprobs)


# ---------------------------------------------------------------------- info and errors
def test_info_endpoints(server):
    status, headers, health = call("GET", server.url + "/health")
    assert status == 200 and headers[WORKER_HEADER] == "cpu-0"
    assert call("GET", server.url + "/health_generate")[0] == 200
    assert call("GET", server.url + "/get_model_info")[2]["model_path"] == "tiny-qwen3.5"
    info = call("GET", server.url + "/get_server_info")[2]
    assert info["dp_size"] == 1 and info["model_path"] == "tiny-qwen3.5"
    assert call("GET", server.url + "/v1/models")[2]["data"][0]["id"] == "tiny-qwen3.5"
    assert call("GET", server.url + "/get_load")[2] == [
        {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]


@pytest.mark.parametrize("path, body, field", [
    ("/generate", {"sampling_params": {}}, "exactly one of 'text' or 'input_ids'"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": "many"}},
     "sampling_params.max_new_tokens"),
    ("/generate", {"text": ["a", "b"]}, "batched prompts"),
    ("/v1/completions", {"prompt": "x", "stop": 3}, "/v1/completions.stop"),
    ("/v1/completions", {"prompt": "x", "stream": True}, "stream"),
    ("/v1/chat/completions", {"messages": "hi"}, "'messages'"),
    # client mistakes that used to be 500s (which clients and routers retry)
    ("/generate", {"input_ids": [3, -7]}, "input_ids[1]: token id -7"),
    ("/generate", {"input_ids": [[2, 10**9]]}, "input_ids[1]: token id 1000000000 is outside the vocabulary"),
    ("/v1/completions", {"prompt": [5, 99999]}, "prompt[1]: token id 99999"),
    ("/generate", {"text": "x", "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
    ("/v1/completions", {"prompt": "x", "top_p": 1.01}, "/v1/completions.top_p"),
    ("/generate", {"text": "x", "sampling_params": {"top_k": 0}}, "sampling_params.top_k"),
    ("/generate", {"text": "x", "sampling_params": {"temperature": -0.5}}, "sampling_params.temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]}, "messages[1].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": {"text": "a"}}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "only a system turn"}]}, "chat template refused them"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "chat_template": "{{ 'x' * 10**9 }}"}, "chat_template: templates are not accepted"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"chat_template": "{{ 1 }}"}},
     "chat_template_kwargs.chat_template"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"x": {"deep": [1]}}},
     "chat_template_kwargs.x"),
    ("/generate", {"text": "x" * (16 * 32768 + 1)}, "cannot fit the context"),
    ("/generate", {"text": "tok " * 40000}, "prompt tokens"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 40000}}, "exceed the context"),
])
def test_bad_requests_name_the_field(server, path, body, field):
    status, _, out = call("POST", server.url + path, body)
    assert status == 400 and field in out["error"]["message"]


def test_a_tiny_temperature_is_greedy_like_sglang(server):
    greedy = call("POST", server.url + "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    tiny = call("POST", server.url + "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 4, "temperature": 1e-300}})
    assert greedy[0] == tiny[0] == 200 and tiny[2]["output_ids"] == greedy[2]["output_ids"]


def test_health_answers_while_a_huge_prompt_is_tokenised(backend, tok):
    """Tokenising 400 KB (~2 s here) used to run on the event loop; now /health must keep answering."""
    with start_server(backend, tokenizer=tok) as handle:  # 400 KB is under 16 bytes x the 32768 positions
        async def go():
            async with aiohttp.ClientSession() as s:
                huge = s.post(handle.url + "/generate", data=orjson.dumps({"text": "word " * 80_000}))
                task = asyncio.ensure_future(huge)
                latencies = []
                while not task.done():
                    started = time.perf_counter()
                    async with s.get(handle.url + "/health") as r:
                        assert r.status == 200
                    latencies.append(time.perf_counter() - started)
                    await asyncio.sleep(0.02)
                async with await task as r:
                    return r.status, (await r.json())["error"]["message"], latencies

        status, message, latencies = asyncio.run(go())
    assert status == 400 and "prompt tokens" in message
    assert len(latencies) >= 2 and max(latencies) < 0.5, latencies


def test_a_client_that_disconnects_cancels_its_generation(server):
    """Greedy decoding of this random model never emits EOS, and 20,000 tokens take minutes; after
    the client leaves, the next request must not wait behind them (one generation at a time)."""
    async def go():
        async with aiohttp.ClientSession() as s:
            with pytest.raises(asyncio.TimeoutError):
                async with s.post(server.url + "/generate", timeout=aiohttp.ClientTimeout(total=0.5),
                                  data=orjson.dumps({"text": "go", "sampling_params": {"max_new_tokens": 20_000, "temperature": 0}})) as r:
                    await r.read()
            started = time.perf_counter()
            async with s.post(server.url + "/generate", data=orjson.dumps({"text": "next", "sampling_params": {"max_new_tokens": 1}})) as r:
                assert r.status == 200
            return time.perf_counter() - started

    assert asyncio.run(go()) < 3.0


def test_bad_request_is_a_non_retryable_backend_error(server):
    backend = HttpBackend(server.url)

    async def go():
        try:
            return await backend.generate("x", SamplingParams(max_new_tokens=-1))
        finally:
            await backend.aclose()

    with pytest.raises(BackendError, match="max_new_tokens") as err:
        asyncio.run(go())
    assert err.value.retryable is False and err.value.status == 400


# ---------------------------------------------------------------------- the CLI
def test_cli_serves_and_shuts_down_gracefully():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "parser.serving.server", "--model", "tiny-qwen3.5",
                             "--port", str(port), "--worker-id", "cli-0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                status, headers, out = call("POST", f"http://127.0.0.1:{port}/generate", {
                    "text": "hello", "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
                break
            except aiohttp.ClientConnectionError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.5)
        assert status == 200 and headers[WORKER_HEADER] == "cli-0" and out["output_ids"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert f"http://127.0.0.1:{port}" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
