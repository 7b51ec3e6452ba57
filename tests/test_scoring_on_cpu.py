"""Answer scoring (`score(prompt_ids, continuation_ids)`) on every backend kind that runs on a CPU,
each checked against a direct forward pass of the same model.

    .venv/bin/pytest tests/test_scoring_on_cpu.py -q

The in-process backend, parser.serving.server behind all three HTTP dialects (SGLang input logprobs, vLLM
prompt logprobs, an OpenAI echo), the worker pool with a dead worker in it, and the retry policy
are the real code on real tiny models (random-weight Qwen3 and the hybrid Qwen3.5). The real
vLLM is in tests/servers/, the SGLang engine in tests/gpu/, the sglang-router gateway in
tests/e2e/test_gateway_router_on_cpu.py. Only the answer parsers' malformed-body cases feed
hand-written bodies: they stand in for a server that answers wrongly.
"""
from __future__ import annotations

import asyncio

import pytest
import torch

from parser.serving.backends import transformers as tb
from parser.serving.types import BackendError, Scorer
from parser.serving.backends.http import HttpBackend
from parser.serving.backends.pool import WorkerPool
from parser.serving.wire.scores import echo_token_logprobs, sglang_input_logprobs, vllm_prompt_logprobs
from parser.serving.backends.transformers import TransformersBackend
from parser.serving.retry import retrying
from parser.serving.server import start_server

TOL = 1e-4  # float32 forward vs the same forward split by a KV cache


def forward_logprobs(model, prompt: list[int], continuation: list[int]) -> list[float]:
    """The reference: one plain forward over prompt + continuation, no cache, no backend."""
    ids = torch.tensor([prompt + continuation])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
    return logp.gather(-1, torch.tensor(continuation)[:, None])[:, 0].tolist()


def ids_of(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def prompt(tiny_tokenizer):
    text = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Question: who built the bridge at Varnholm?\nEvidence: Ada Okafor built it."}],
        tokenize=False, add_generation_prompt=True)
    return ids_of(tiny_tokenizer, text)


@pytest.fixture(scope="module")
def answer(tiny_tokenizer):
    return ids_of(tiny_tokenizer, "Ada Okafor")


@pytest.mark.parametrize("which", ["tiny_qwen3_model", "tiny_qwen3_5_model"])
def test_in_process_score_equals_a_forward_pass(which, request, tiny_tokenizer, prompt, answer):
    model = request.getfixturevalue(which)
    backend = TransformersBackend(model, tiny_tokenizer)
    assert isinstance(backend, Scorer)
    got = asyncio.run(backend.score(prompt, answer))
    assert got == pytest.approx(forward_logprobs(model, prompt, answer), abs=TOL)
    assert all(v < 0 for v in got)


def test_long_continuation_is_scored_in_slices_with_the_same_values(monkeypatch, tiny_qwen3_5_model, tiny_tokenizer, prompt):
    long = ids_of(tiny_tokenizer, "the bridge was built of stone and iron over eleven years " * 3)
    monkeypatch.setattr(tb, "SCORE_SLICE", 7)  # several slices through the recurrent + KV cache
    got = asyncio.run(TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer).score(prompt, long))
    assert len(long) > 3 * 7 and got == pytest.approx(forward_logprobs(tiny_qwen3_5_model, prompt, long), abs=TOL)


def test_scoring_leaves_generation_and_its_prefix_cache_alone(tiny_backend, prompt, answer):
    from parser.serving.types import SamplingParams

    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    before = tiny_backend.generate_ids(prompt, greedy, key="k").token_ids
    asyncio.run(tiny_backend.score(prompt, answer, routing_key="k"))
    assert tiny_backend.generate_ids(prompt, greedy, key="k").token_ids == before


def test_empty_parts_and_over_long_inputs_are_refused(tiny_backend, prompt, answer):
    for p, c in (([], answer), (prompt, [])):
        with pytest.raises(BackendError) as err:
            asyncio.run(tiny_backend.score(p, c))
        assert not err.value.retryable
    limit = tiny_backend.model.config.max_position_embeddings
    with pytest.raises(BackendError, match="max_position_embeddings"):
        asyncio.run(tiny_backend.score(prompt * (limit // len(prompt) + 1), answer))


# ---------------------------------------------------------------------- over HTTP (parser.serving.server)
@pytest.fixture(scope="module")
def served(tiny_qwen3_5_model, tiny_tokenizer):
    with start_server(TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer), tokenizer=tiny_tokenizer,
                      model_name="tiny", worker_id="w0") as handle:
        yield handle


@pytest.mark.parametrize("api,server", [("sglang", "sglang"), ("completions", "vllm"), ("completions", "generic")])
def test_every_http_dialect_scores_like_the_model(served, api, server, tiny_qwen3_5_model, prompt, answer):
    async def go():
        async with HttpBackend(served.url, api=api, server=server) as backend:
            return await backend.score(prompt, answer, routing_key="doc:0", request_id="r1")

    assert asyncio.run(go()) == pytest.approx(forward_logprobs(tiny_qwen3_5_model, prompt, answer), abs=TOL)


def test_a_chat_api_refuses_to_score(served, prompt, answer):
    async def go():
        async with HttpBackend(served.url, api="chat") as backend:
            await backend.score(prompt, answer)

    with pytest.raises(BackendError, match="api='chat'") as err:
        asyncio.run(go())
    assert not err.value.retryable


def test_serve_generates_after_input_logprobs_when_asked(served, prompt, answer, tiny_qwen3_5_model):
    """SGLang's contract: input logprobs from logprob_start_len on (None first), plus output."""
    import aiohttp
    import orjson

    ids = prompt + answer
    body = {"input_ids": ids, "return_logprob": True, "logprob_start_len": len(prompt) - 1,
            "sampling_params": {"max_new_tokens": 3, "temperature": 1.0, "top_k": 1}}

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.post(served.url + "/generate", data=orjson.dumps(body)) as r:
                return r.status, orjson.loads(await r.read())

    status, out = asyncio.run(go())
    assert status == 200
    triples = out["meta_info"]["input_token_logprobs"]
    assert [t[1] for t in triples] == ids[len(prompt) - 1:] and triples[0][0] is None
    assert [t[0] for t in triples[1:]] == pytest.approx(forward_logprobs(tiny_qwen3_5_model, prompt, answer), abs=TOL)
    assert len(out["output_ids"]) == 3 and len(out["meta_info"]["output_token_logprobs"]) == 3


def test_serve_names_the_field_of_a_bad_scoring_request(served, prompt):
    import aiohttp
    import orjson

    async def post(path, body):
        async with aiohttp.ClientSession() as s:
            async with s.post(served.url + path, data=orjson.dumps(body)) as r:
                return r.status, orjson.loads(await r.read())["error"]["message"]

    cases = [
        ("/generate", {"input_ids": prompt, "return_logprob": True, "logprob_start_len": len(prompt),
                       "sampling_params": {"max_new_tokens": 0}}, "outside the prompt"),
        ("/generate", {"input_ids": prompt, "return_logprob": True, "logprob_start_len": 0,
                       "sampling_params": {"max_new_tokens": 0, "temperature": 0.5}}, "temperature 1"),
        ("/v1/completions", {"prompt": prompt, "prompt_logprobs": 5, "max_tokens": 1}, "prompt_logprobs"),
        ("/v1/completions", {"prompt": prompt, "echo": True, "logprobs": 0, "max_tokens": 4}, "echo"),
    ]
    for path, body, needle in cases:
        status, message = asyncio.run(post(path, body))
        assert status == 400 and needle in message, (path, message)


def test_pool_scores_on_the_keys_worker_and_fails_over(served, tiny_qwen3_5_model, prompt, answer):
    """One of two workers is a closed port: the retry policy re-sends, the pool picks the live one."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    want = forward_logprobs(tiny_qwen3_5_model, prompt, answer)

    async def go():
        pool = WorkerPool([HttpBackend(dead, timeout_s=5), HttpBackend(served.url)], cooldown_s=30)
        attempts = 0
        try:
            async for attempt in retrying(max_attempts=3, backoff_s=0.01):
                with attempt:
                    attempts += 1
                    # a key whose first-ranked worker is the dead one
                    key = next(k for k in (f"doc:{i}" for i in range(100)) if pool.ranking(k)[0] == 0)
                    got = await pool.score(prompt, answer, routing_key=key)
            return got, attempts
        finally:
            await pool.aclose()

    got, attempts = asyncio.run(go())
    assert got == pytest.approx(want, abs=TOL) and attempts == 2


# ---------------------------------------------------------------------- what a wrong server answer does
def test_parsers_take_the_continuation_from_the_end_and_check_its_ids():
    cont = [7, 8]
    triples = [[None, 6, None], [-0.5, 7, None], [-1.5, 8, None]]
    assert sglang_input_logprobs({"input_token_logprobs": triples}, cont, "w") == [-0.5, -1.5]
    with pytest.raises(BackendError, match="not the continuation"):  # shifted by one: refused, never misread
        sglang_input_logprobs({"input_token_logprobs": triples[:-1] + [[-2.0, 9, None]]}, cont, "w")
    with pytest.raises(BackendError, match="no finite logprob"):
        sglang_input_logprobs({"input_token_logprobs": [[None, 7, None], [-1.0, 8, None]]}, cont, "w")
    prompt_lps = [None, {"6": {"logprob": -0.1}}, {"7": {"logprob": -0.5, "rank": 3}}, {"8": {"logprob": -1.5}}]
    assert vllm_prompt_logprobs(prompt_lps, cont, "w") == [-0.5, -1.5]
    with pytest.raises(BackendError, match="no entry for token 8"):
        vllm_prompt_logprobs(prompt_lps[:-1] + [{"9": {"logprob": -1.0}}], cont, "w")
    with pytest.raises(BackendError, match="fewer than"):
        vllm_prompt_logprobs([None], cont, "w")
    assert echo_token_logprobs({"token_logprobs": [None, -0.1, -0.5, -1.5]}, 2, cont, "w") == [-0.5, -1.5]
    with pytest.raises(BackendError, match="echo gave 5"):  # a server that also generated a token
        echo_token_logprobs({"token_logprobs": [None, -0.1, -0.5, -1.5, -3.0]}, 2, cont, "w")
