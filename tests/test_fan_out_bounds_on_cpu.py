"""One lead turn's fan-out is bounded, and a bound that cannot work is refused when configured.

    .venv/bin/pytest tests/test_fan_out_bounds_on_cpu.py -q

A lead turn with thousands of tool calls ran every one at once (thousands of sandbox processes,
or calls x chunks subagent requests), and `max_concurrency: 0` made every episode wait for ever.
The engine, QueryAgents and FunctionTools are real; the lead is scripted and the readers count
what reaches them (the outer edge). Real Qwen3.5 tokenizer and chat template.
"""
from __future__ import annotations

import asyncio

import pytest

from parser.text.chunking import Chunk
from parser.base.config import EpisodeConfig, episode_preset
from parser.engine.episode import EpisodeEngine
from parser.engine.tools import FunctionTools, ReaderReply, TurnRules
from scripted_lead import CALL, ScriptedLead

class CountingReader:
    def __init__(self):
        self.reads, self.in_flight, self.peak = 0, 0, 0

    async def read(self, query, chunk, doc_id):
        self.reads += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(0)
        self.in_flight -= 1
        return ReaderReply('{"answer": "unknown"}')

    def forget(self, doc_id):
        pass

    def close(self):
        pass


def calls(n: int, tool: str = "query_agents", arg: str = "query") -> str:
    return "Many.\n</think>\n\n" + "\n".join(CALL.format(tool, arg, f"q{i}") for i in range(n))


def chunks(n: int) -> list[Chunk]:
    return [Chunk(i, f"Document {i + 1}:\ntext {i}", (i + 1,), 6) for i in range(n)]


def episode(tokenizer, turn: str, num_chunks: int, **config):
    reader = CountingReader()
    engine = EpisodeEngine(ScriptedLead(tokenizer, [turn]), tokenizer, reader, EpisodeConfig(**config))
    trajectory = asyncio.run(asyncio.wait_for(engine.run("Who?", chunks(num_chunks), doc_id="d"), 120))
    return trajectory, reader


def test_a_turn_of_two_thousand_queries_runs_sixteen(qwen3_5_tokenizer):
    trajectory, reader = episode(qwen3_5_tokenizer, calls(2000), num_chunks=3)
    first = trajectory.turns[0]
    assert reader.reads == 16 * 3 and len(first.queries) == 16 and first.calls_not_run == 1984
    tool_messages = [m for m in trajectory.messages if m["role"] == "tool"]
    assert len(tool_messages) == 2000 and "Not run: this turn made 2000 tool calls, and at most 16" in tool_messages[-1]["content"]
    assert trajectory.answer == "x"


def test_queries_times_chunks_stay_within_the_request_bound(qwen3_5_tokenizer):
    trajectory, reader = episode(qwen3_5_tokenizer, calls(5), num_chunks=40, max_subagent_requests_per_turn=100)
    assert reader.reads == 2 * 40 and trajectory.turns[0].calls_not_run == 3


def test_one_query_always_runs_even_over_the_request_bound(qwen3_5_tokenizer):
    trajectory, reader = episode(qwen3_5_tokenizer, calls(3), num_chunks=50, max_subagent_requests_per_turn=10)
    assert reader.reads == 50 and trajectory.turns[0].calls_not_run == 2


def test_requests_in_flight_stay_within_max_concurrency(qwen3_5_tokenizer):
    _, reader = episode(qwen3_5_tokenizer, calls(4), num_chunks=30, max_concurrency=7)
    assert reader.reads == 120 and reader.peak <= 7


def test_a_tool_set_of_functions_runs_a_bounded_number_per_turn(qwen3_5_tokenizer):
    """The DCI agent's shape: plain async tools (each would start a sandbox process)."""
    started = 0

    class Probe(FunctionTools):
        rules = TurnRules()

        def __init__(self):
            self.functions = {"probe": self.probe}
            self.tool_schemas = [{"type": "function", "function": {"name": "probe", "description": "probe",
                                  "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}]

        async def probe(self, arguments):
            nonlocal started
            started += 1
            return "ok"

        def system_prompt(self):
            return "Use probe."

        def user_prompt(self, question):
            return question

        def invalid_action(self, error):
            return error

    engine = EpisodeEngine(ScriptedLead(qwen3_5_tokenizer, [calls(500, "probe", "x")]), qwen3_5_tokenizer,
                           config=EpisodeConfig(max_tool_calls_per_turn=4))
    trajectory = asyncio.run(asyncio.wait_for(engine.run_tools("Q?", Probe()), 60))
    assert started == 4 and trajectory.turns[0].calls_not_run == 496


@pytest.mark.parametrize("field, value", [
    ("max_concurrency", 0), ("max_concurrency", -3), ("max_turns", 0), ("max_attempts", 0), ("max_tool_calls_per_turn", 0),
    ("max_subagent_requests_per_turn", 0), ("request_timeout_s", 0), ("request_timeout_s", float("inf")),
    ("request_timeout_s", float("nan")), ("lead_top_p", 0.0), ("lead_top_p", 1.5), ("lead_temperature", -1.0),
    ("observation_token_budget", 0), ("max_response_tokens", 0), ("max_concurrency", True), ("max_concurrency", 2.5),
    ("lead_top_k", 0), ("chunk_size", 0), ("chunk_size", -512), ("chunk_size", 2.5), ("retry_backoff_s", float("nan")),
    ("subagent_max_tokens", 0), ("subagent_temperature", float("inf")),
])
def test_a_bound_that_cannot_work_is_refused_at_config_time(field, value):
    with pytest.raises(ValueError, match=f"episode.{field}"):
        EpisodeConfig(**{field: value})


def test_a_preset_override_that_would_hang_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="episode.max_concurrency=0: expected an integer >= 1"):
        episode_preset("eval", max_concurrency=0)
