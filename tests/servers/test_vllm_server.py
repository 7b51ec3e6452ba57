"""The episode engine and HttpBackend against a real vLLM (CPU build) serving SmolLM2-135M.

    make test-servers          # builds .venv-vllm, starts vLLM on 127.0.0.1, runs this file

What must hold on a real server that other OpenAI-compatible servers and our own parser.serving.server
only approximate: the lead's token view (ids, masks) equals the in-process run; a scatter round
of >= 64 chunks completes with every call answered and the chunk prefixes cached; constrained
replies (JSON schema, the lead's one-action regex) come back in the language asked for; and the
failure cases are classified right (validation errors are not retried, the model name is found).
"""
from __future__ import annotations

import asyncio
import re
import time

import orjson
import pytest

from parser.engine import prompts
from parser.text.actions import action_regex
from parser.serving.backends import load_model_and_tokenizer
from parser.serving.types import BackendError, SamplingParams
from parser.serving.backends.http import HttpBackend
from parser.serving.backends.transformers import TransformersBackend
from parser.text.chunking import chunk_document
from parser.engine.episode import EpisodeConfig, EpisodeEngine
from parser.engine.protocol import protocol_for
from parser.engine.readers import SubagentReader
from parser.engine.tools import QueryAgents

from varnholm import NEEDLE, QUESTION, document, episode_config


@pytest.fixture(scope="module")
def smollm2():
    return load_model_and_tokenizer("smollm2")


def run(coro):
    return asyncio.run(coro)


async def run_episode(lead, subagent, tokenizer, config, chunks):
    reader = SubagentReader(subagent, tokenizer, temperature=0.0, max_new_tokens=config.subagent_max_tokens, json_constrained=True)
    try:
        return await EpisodeEngine(lead, tokenizer, reader, config).run(QUESTION, chunks, doc_id="varnholm")
    finally:
        await lead.aclose()
        await subagent.aclose()


def test_lead_token_view_equals_the_in_process_run(vllm, smollm2):
    """Greedy, float32 on both sides: the same generated ids, masks and (nearly) logprobs. The
    subagents run in process for both, so the observations are the same whenever the lead's
    queries are (vLLM's CPU kernels may round differently, which a 64-token subagent reply can
    turn into another finding; the lead's token path is what is checked here)."""
    model, tokenizer = smollm2
    config = episode_config()
    chunks = chunk_document(document(24), tokenizer, 512)
    in_process = run(run_episode(TransformersBackend(model, tokenizer), TransformersBackend(model, tokenizer),
                                 tokenizer, config, chunks))
    started = time.perf_counter()
    served = run(run_episode(HttpBackend(vllm.url, api="completions", server="vllm"), TransformersBackend(model, tokenizer),
                             tokenizer, config, chunks))
    print(f"\n[vllm] {served.num_turns}-turn episode over {len(chunks)} chunks: {time.perf_counter() - started:.1f} s "
          f"(in process: {in_process.wall_s:.1f} s)")
    assert served.token_view_valid, served.token_view_note
    assert served.constraints == ["subagents: json_schema", "lead: one action per turn"]
    assert served.response_ids == in_process.response_ids
    assert served.response_mask == in_process.response_mask
    assert served.response_logprobs == pytest.approx(in_process.response_logprobs, abs=0.05)
    assert served.turns[0].queries, "the constrained lead scatters on its first turn"


def test_scatter_round_of_64_chunks_answers_every_call_and_reuses_prefixes(vllm, smollm2):
    _, tokenizer = smollm2
    chunks = chunk_document(document(260), tokenizer, 96)
    assert len(chunks) >= 64
    backend = HttpBackend(vllm.url, api="chat", server="vllm", chat_template_kwargs={})  # messages: vLLM renders
    reader = SubagentReader(backend, tokenizer, temperature=0.0, max_new_tokens=48, json_constrained=True)
    tool = QueryAgents(reader, chunks, "varnholm", EpisodeConfig(), protocol_for(EpisodeConfig()), asyncio.Semaphore(512),
                       lambda text: len(tokenizer.encode(text, add_special_tokens=False)))

    async def two_rounds():
        try:
            first_started = time.perf_counter()
            first = await tool.scatter(QUESTION)
            first_s = time.perf_counter() - first_started
            second = await tool.scatter("When was the lighthouse keeper of Varnholm appointed?")
            return first, first_s, second
        finally:
            await backend.aclose()

    first, first_s, second = run(two_rounds())
    print(f"\n[vllm] scatter over {len(chunks)} chunks: {first_s:.1f} s, {len(first.findings)} findings; "
          f"second round {second.latency_s:.1f} s, cached {sum(c.cached_tokens for c in second.calls)} prompt tokens")
    assert first.failures == 0 and second.failures == 0
    assert all(c.status in ("finding", "abstain") for c in first.calls)
    assert all(c.completion_tokens <= 48 for c in first.calls)
    # instructions + chunk are a shared prefix across rounds: vLLM's prefix cache serves them
    assert sum(c.cached_tokens for c in second.calls) > 0.5 * sum(c.prompt_tokens for c in second.calls)


def test_constrained_replies_are_in_the_language_asked_for(vllm, smollm2):
    _, tokenizer = smollm2
    schema = prompts.LEAD.path(prompts.DEFAULT_VERSION, "subagent_schema.json").read_text()
    regex = action_regex(prompts.lead_tools(prompts.DEFAULT_VERSION), "json")
    backend = HttpBackend(vllm.url, api="completions", server="vllm")
    subagent_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompts.render("subagent", prompts.DEFAULT_VERSION, chunk=NEEDLE, query=QUESTION)}],
        tokenize=False, add_generation_prompt=True)
    lead_prompt = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True)

    async def go():
        try:
            reply = await backend.generate(subagent_prompt, SamplingParams(max_new_tokens=64, temperature=0.0, json_schema=schema))
            action = await backend.generate(lead_prompt, SamplingParams(max_new_tokens=64, temperature=0.0, regex=regex))
            return reply, action
        finally:
            await backend.aclose()

    reply, action = run(go())
    assert list(orjson.loads(reply.text))[0] == "answer", reply.text  # answer before evidence
    assert re.fullmatch(regex, action.text), action.text
    assert action.token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")  # the ids include the turn's end


def test_failure_cases_are_classified(vllm, smollm2):
    _, tokenizer = smollm2
    sp = SamplingParams(max_new_tokens=4, temperature=0.0)

    async def go():
        errors = {}
        backend = HttpBackend(vllm.url, api="completions", server="vllm")
        wrong_model = HttpBackend(vllm.url, api="completions", server="vllm", model="no-such-model")
        try:
            for name, call in (("too_long", backend.generate([17] * (vllm.max_model_len + 10), sp)),
                               ("wrong_model", wrong_model.generate("hello", sp)),
                               ("bad_regex", backend.generate("hello", SamplingParams(max_new_tokens=4, regex="(")))):
                try:
                    await call
                except BackendError as error:
                    errors[name] = error
            ok = await backend.generate("hello", sp, request_id="varnholm", routing_key="varnholm:0")
            return errors, ok, backend.model
        finally:
            await backend.aclose()
            await wrong_model.aclose()

    errors, ok, discovered = run(go())
    assert discovered == vllm.model
    assert set(errors) == {"too_long", "wrong_model", "bad_regex"}
    for name, error in errors.items():
        assert error.retryable is False and error.status in (400, 404), (name, error)
        assert len(str(error)) < 800
    assert "maximum context length" in str(errors["too_long"]) or "context" in str(errors["too_long"])
    assert ok.token_ids and ok.prompt_tokens > 0  # the request-id and routing headers are accepted


def test_answer_scoring_equals_the_in_process_forward(vllm, smollm2):
    """`score` on vLLM two ways — its `prompt_logprobs` extension (server: vllm) and the OpenAI
    `echo` + `max_tokens: 0` way (server: generic) — against a float32 forward of the same weights."""
    model, tokenizer = smollm2
    text = tokenizer.apply_chat_template([{"role": "user", "content": f"{NEEDLE}\n\n{QUESTION}"}], tokenize=False,
                                         add_generation_prompt=True)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    answer = tokenizer.encode("Edda Quist", add_special_tokens=False)
    wrong = tokenizer.encode("Anna Berg", add_special_tokens=False)
    want = run(TransformersBackend(model, tokenizer).score(prompt, answer))

    async def go(server, continuation):
        backend = HttpBackend(vllm.url, api="completions", server=server, model=vllm.model)
        try:
            return await backend.score(prompt, continuation, request_id="score-1")
        finally:
            await backend.aclose()

    for server in ("vllm", "generic"):
        got = run(go(server, answer))
        print(f"\n[vllm] score via {server}: {[round(v, 4) for v in got]} (in process {[round(v, 4) for v in want]})")
        assert got == pytest.approx(want, abs=0.01), server
    # the needle is in the prompt: its answer is far likelier than a wrong one
    assert sum(want) / len(want) > sum(run(go("vllm", wrong))) / len(wrong)
