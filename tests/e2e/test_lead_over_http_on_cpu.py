"""The lead agent over HTTP: the token view equals the in-process run, or says it cannot.

The server is `parser.serving.server` (the project's real CPU server, speaking vLLM's `return_token_ids`
and `structured_outputs`) over the tiny random Qwen3.5 model; the in-process run is the same
model through `TransformersBackend`. Greedy decoding, so both must produce the same tokens.

    .venv/bin/pytest tests/test_lead_over_http_on_cpu.py -q
"""
from __future__ import annotations

import asyncio
import re

import pytest

from parser.text.actions import parse_lead_output
from parser.serving.types import BackendError, Completion
from parser.serving.backends.http import HttpBackend
from parser.serving.backends.transformers import TransformersBackend
from parser.text.chunking import Chunk
from parser.engine.episode import EpisodeConfig, EpisodeEngine
from parser.engine.readers import SubagentReader
from parser.serving.server import start_server

CHUNKS = [Chunk(0, "Zorvan is a film directed by Miro Tal.", (1,), 9), Chunk(1, "Miro Tal was born in 1950.", (2,), 8)]


def config(**overrides) -> EpisodeConfig:
    return EpisodeConfig(**{"max_turns": 2, "max_tokens_per_turn": 12, "lead_temperature": 0.0, "subagent_max_tokens": 4,
                            "subagent_temperature": 0.0, "retry_backoff_s": 0.01, **overrides})


def episode(lead, tokenizer, model, cfg: EpisodeConfig):
    reader = SubagentReader(TransformersBackend(model, tokenizer), tokenizer, max_new_tokens=cfg.subagent_max_tokens,
                            temperature=0.0, json_constrained=cfg.constrain_subagents)

    async def go():
        try:
            return await EpisodeEngine(lead, tokenizer, reader, cfg).run("Who directed Zorvan?", CHUNKS, doc_id="d1")
        finally:
            await lead.aclose()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def server(tiny_qwen3_5_model, tiny_tokenizer):
    with start_server(TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer), tokenizer=tiny_tokenizer,
                      model_name="tiny-qwen3.5") as handle:
        yield handle


@pytest.mark.parametrize("constrain_lead", [False, True])
def test_vllm_style_lead_equals_the_in_process_run(server, tiny_qwen3_5_model, tiny_tokenizer, constrain_lead):
    cfg = config(constrain_lead=constrain_lead, lead_thinking=False)
    local = episode(TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer), tiny_tokenizer, tiny_qwen3_5_model, cfg)
    remote_lead = HttpBackend(server.url, api="completions", server="vllm")  # model name from /v1/models
    remote = episode(remote_lead, tiny_tokenizer, tiny_qwen3_5_model, cfg)
    assert remote_lead.model == "tiny-qwen3.5"
    assert remote.token_view_valid and remote.token_view_note is None
    assert remote.response_ids == local.response_ids and remote.response_mask == local.response_mask
    assert remote.response_logprobs == pytest.approx(local.response_logprobs, abs=1e-5)
    assert [t.text for t in remote.turns] == [t.text for t in local.turns]
    if constrain_lead:  # a random model, held to one call or one answer (here cut by the 12-token budget)
        assert remote.constraints == ["lead: one action per turn"]
        for turn in remote.turns:
            assert turn.text.startswith(("<tool_call>\n<function=query_agents>", "<answer>")), turn.text
            assert turn.finish_reason == "length" or turn.action_error is None, turn.text


def test_text_only_server_gives_an_approximate_token_view_that_says_so(server, tiny_qwen3_5_model, tiny_tokenizer):
    trajectory = episode(HttpBackend(server.url, api="completions", server="generic"), tiny_tokenizer,
                         tiny_qwen3_5_model, config())
    assert not trajectory.token_view_valid
    assert "re-tokenisation" in trajectory.token_view_note


class FlakyLead:
    """The in-process model behind a server that fails `failures` times first (stands in for a
    503 / dropped connection from a real server; the error is the one HttpBackend raises)."""

    def __init__(self, backend, failures: int, retryable: bool = True):
        self.backend, self.failures, self.retryable, self.calls = backend, failures, retryable, 0

    async def generate(self, prompt, sampling, **ids) -> Completion:
        self.calls += 1
        if self.calls <= self.failures:
            raise BackendError("HTTP 503: busy" if self.retryable else "HTTP 400: bad request", retryable=self.retryable)
        return await self.backend.generate(prompt, sampling, **ids)

    async def aclose(self):
        await self.backend.aclose()


def test_lead_generations_are_retried_like_subagent_calls(tiny_qwen3_5_model, tiny_tokenizer):
    lead = FlakyLead(TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer), failures=2)
    trajectory = episode(lead, tiny_tokenizer, tiny_qwen3_5_model, config(max_turns=1))
    assert trajectory.turns[0].lead_attempts == 3 and lead.calls == 3


def test_lead_validation_errors_fail_at_once(tiny_qwen3_5_model, tiny_tokenizer):
    lead = FlakyLead(TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer), failures=5, retryable=False)
    with pytest.raises(BackendError, match="bad request"):
        episode(lead, tiny_tokenizer, tiny_qwen3_5_model, config(max_turns=1))
    assert lead.calls == 1


def test_logprobs_that_do_not_align_with_ids_are_flagged(tiny_qwen3_5_model, tiny_tokenizer):
    class OffByOne(FlakyLead):  # a server returning the EOS logprob without its id (seen on vLLM without ids)
        async def generate(self, prompt, sampling, **ids):
            out = await self.backend.generate(prompt, sampling, **ids)
            out.logprobs = out.logprobs + [-1.0]
            return out

    trajectory = episode(OffByOne(TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer), 0), tiny_tokenizer,
                         tiny_qwen3_5_model, config(max_turns=1))
    assert not trajectory.token_view_valid and "logprobs for" in trajectory.token_view_note


def test_lead_constraint_regex_on_the_server_and_in_process_agree(server, tiny_qwen3_5_model, tiny_tokenizer):
    """A regex constraint sent in vLLM's dialect is honoured by the server's backend (xgrammar)."""
    from parser.serving.types import SamplingParams

    regex = r"<answer>[a-z]{2,6}</answer>"
    sp = SamplingParams(max_new_tokens=16, temperature=0.0, regex=regex)
    prompt = tiny_tokenizer.encode("Where?", add_special_tokens=False)

    async def both():
        remote = HttpBackend(server.url, api="completions", server="vllm")
        try:
            return (await remote.generate(prompt, sp)), (await TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer).generate(prompt, sp))
        finally:
            await remote.aclose()

    remote, local = asyncio.run(both())
    assert remote.token_ids == local.token_ids and re.fullmatch(regex, local.text), local.text
    assert parse_lead_output(local.text).answer is not None


def test_verl_refuses_the_lead_constraint_but_not_the_subagent_one():
    pytest.importorskip("verl")
    from parser.train.worker import episode_config

    assert episode_config({"constrain_subagents": True}, 512).constraints() == ["subagents: json_schema"]
    with pytest.raises(ValueError, match="constrain_lead"):
        episode_config({"constrain_lead": True}, 512)


@pytest.mark.parametrize("api,server_kind", [("sglang", "sglang"), ("chat", "vllm")])
def test_json_constrained_subagent_replies_through_the_server(server, tiny_tokenizer, api, server_kind):
    """SGLang's sampling_params.json_schema and vLLM's structured_outputs reach the model: even a
    random model's reply is the finding's JSON, answer first."""
    import orjson

    backend = HttpBackend(server.url, api=api, server=server_kind)
    reader = SubagentReader(backend, tiny_tokenizer, temperature=0.0, max_new_tokens=40, json_constrained=True)

    async def go():
        try:
            return await reader.read("Who directed Zorvan?", CHUNKS[0], "d1")
        finally:
            await backend.aclose()

    reply = asyncio.run(go())
    assert reply.text.startswith('{"answer": "'), reply.text
    if reply.completion_tokens < 40:  # finished inside the budget: complete JSON
        assert list(orjson.loads(reply.text)) == ["answer", "evidence"]


@pytest.mark.parametrize("dialect", ["json", "xml"])
def test_action_regex_accepts_exactly_one_bounded_call_or_answer(dialect):
    from parser.engine import prompts
    from parser.text.actions import MAX_QUERY_CHARS, action_regex

    regex = action_regex(prompts.lead_tools(prompts.DEFAULT_VERSION), dialect)
    call = ('<tool_call>{{"name": "query_agents", "arguments": {{"query": "{}"}}}}</tool_call>' if dialect == "json" else
            "<tool_call>\n<function=query_agents>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>")
    assert parse_lead_output(re.fullmatch(regex, call.format("Who directed Zorvan?")).group(0)).queries == ["Who directed Zorvan?"]
    assert re.fullmatch(regex, "<answer>Miro Tal</answer>")
    assert not re.fullmatch(regex, call.format("q" * (MAX_QUERY_CHARS + 1)))
    assert not re.fullmatch(regex, call.format("a") + call.format("b"))  # one call per turn
    assert not re.fullmatch(regex, "The answer is <answer>x</answer>")
    with pytest.raises(ValueError, match="one string argument"):
        action_regex([{"type": "function", "function": {"name": "f", "parameters": {"properties": {}}}}], dialect)
