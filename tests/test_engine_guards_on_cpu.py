"""The engine's smaller guards: the observation budget holds even for the first finding, an
`<answer>` inside unfinished thinking is not an answer, and backend token ids are checked.

    .venv/bin/pytest tests/test_engine_guards_on_cpu.py -q

Real Qwen3.5 tokenizer and chat template, real gather and engine; only the lead is scripted.
"""
from __future__ import annotations

import asyncio
import math

import pytest

from parser.serving.types import BackendError
from parser.text.chunking import Chunk
from parser.base.config import EpisodeConfig
from parser.engine.episode import EpisodeEngine
from parser.engine.gather import render_observation
from parser.engine.tools import ReaderReply
from parser.records.trajectory import Finding
from scripted_lead import CALL, ScriptedLead

QUERY = CALL.format("query_agents", "query", "{}")


def counter(tokenizer):
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


# -- the observation budget -----------------------------------------------------------------------
def test_a_huge_first_finding_is_cut_to_the_budget(qwen3_5_tokenizer):
    """A 120K-token finding passed a 256-token budget whole, reported as "0 omitted"."""
    count = counter(qwen3_5_tokenizer)
    evidence = "Zorvan was filmed in the harbour of a town. " * 12_000
    text, omitted = render_observation("Who directed Zorvan?", [Finding("agent_0", 0, "Miro Tal", evidence)], 40, count, 256)
    assert count(text) <= 256 and omitted == 0
    assert "Miro Tal" in text and "cut to fit the observation budget" in text


def test_a_huge_first_answer_is_cut_and_the_rest_omitted(qwen3_5_tokenizer):
    count = counter(qwen3_5_tokenizer)
    findings = [Finding("agent_0", 0, "Tal " * 5000, "e"), Finding("agent_1", 1, "Miro", "short")]
    text, omitted = render_observation("Who?", findings, 2, count, 200)
    assert count(text) <= 200 + 8 and omitted == 1 and "1 more findings omitted" in text


def test_findings_that_fit_are_kept_whole(qwen3_5_tokenizer):
    count = counter(qwen3_5_tokenizer)
    findings = [Finding(f"agent_{i}", i, f"answer {i}", "short evidence") for i in range(3)]
    text, omitted = render_observation("Who?", findings, 3, count, 4096)
    assert omitted == 0 and "cut to fit" not in text and text.count("short evidence") == 3


def test_a_budget_smaller_than_the_header_omits_the_finding(qwen3_5_tokenizer):
    count = counter(qwen3_5_tokenizer)
    text, omitted = render_observation("Who? " * 100, [Finding("agent_0", 0, "Miro Tal", "x" * 5000)], 1, count, 50)
    assert omitted == 1 and "x" * 100 not in text


# -- unfinished thinking ----------------------------------------------------------------------------
class Reader:
    async def read(self, query, chunk, doc_id):
        self.queries = getattr(self, "queries", []) + [query]
        return ReaderReply('{"evidence": "Zorvan is by Miro Tal.", "answer": "Miro Tal"}')

    def forget(self, doc_id):
        pass

    def close(self):
        pass


def episode(tokenizer, lead, **config):
    reader = Reader()
    engine = EpisodeEngine(lead, tokenizer, reader, EpisodeConfig(retry_backoff_s=0, **config))
    chunks = [Chunk(0, "Document 1:\nZorvan is by Miro Tal.", (1,), 8)]
    return asyncio.run(asyncio.wait_for(engine.run("Who directed Zorvan?", chunks, doc_id="d"), 60)), reader


def test_an_answer_inside_thinking_cut_at_the_limit_does_not_end_the_episode(qwen3_5_tokenizer):
    script = [("Maybe it is <answer>Anna Berg</answer>, but I should check with the agents and", "length"),
              ("Check.\n</think>\n\n" + QUERY.format("Who directed Zorvan?"), "stop"),
              ("Found.\n</think>\n\n<answer>Miro Tal</answer>", "stop")]
    trajectory, _ = episode(qwen3_5_tokenizer, ScriptedLead(qwen3_5_tokenizer, script))
    assert trajectory.answer == "Miro Tal" and trajectory.num_turns == 3
    assert "thinking not finished" in trajectory.turns[0].action_error


def test_a_tool_call_inside_unfinished_thinking_is_not_run(qwen3_5_tokenizer):
    script = [("I could call " + QUERY.format("a half-thought query") + " but", "length"),
              ("Done.\n</think>\n\n<answer>Miro Tal</answer>", "stop")]
    trajectory, reader = episode(qwen3_5_tokenizer, ScriptedLead(qwen3_5_tokenizer, script))
    assert not hasattr(reader, "queries") and trajectory.turns[0].queries == []


def test_an_explicit_unclosed_think_block_is_thinking_without_the_prompt_opening_it():
    from parser.text.actions import parse_lead_output, split_thinking

    assert parse_lead_output("<think>maybe <answer>Anna</answer>").answer is None
    assert split_thinking("<think>still going") == ("still going", "")
    assert parse_lead_output("no thinking at all <answer>Anna</answer>").answer == "Anna"  # nothing was opened


def test_the_release_protocol_keeps_its_rule_for_answers_in_thinking(qwen3_5_tokenizer):
    """The release searches the whole turn, thinking included (docs/fidelity.md row 7)."""
    from parser.engine.protocol import protocol_for

    release = protocol_for(EpisodeConfig(protocol="release"))
    assert release.parse_turn("maybe <answer>Anna</answer> hmm", ("query_agents",), thinking_open=True).answer == "Anna"


# -- backend token ids ------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [[5, 10**9], [-1], [3, True], [2.0]])
def test_token_ids_outside_the_vocabulary_are_retried_then_refused(qwen3_5_tokenizer, bad):
    lead = ScriptedLead(qwen3_5_tokenizer, [], ids=[bad] * 9)
    with pytest.raises(BackendError, match="outside the lead tokenizer's vocabulary"):
        episode(qwen3_5_tokenizer, lead, max_attempts=2)
    assert lead.calls == 2


def test_a_garbled_generation_is_retried_and_the_stream_stays_clean(qwen3_5_tokenizer):
    good = qwen3_5_tokenizer.encode("Sure.\n</think>\n\n<answer>Miro Tal</answer>", add_special_tokens=False)
    lead = ScriptedLead(qwen3_5_tokenizer, [], ids=[[len(qwen3_5_tokenizer) + 7], good])
    trajectory, _ = episode(qwen3_5_tokenizer, lead)
    assert trajectory.answer == "Miro Tal" and trajectory.turns[0].lead_attempts == 2
    assert max(trajectory.response_ids) < len(qwen3_5_tokenizer)


def test_logprobs_that_are_not_numbers_make_the_view_approximate(qwen3_5_tokenizer):
    lead = ScriptedLead(qwen3_5_tokenizer, ["Sure.\n</think>\n\n<answer>Miro Tal</answer>"], logprobs=[math.nan])
    trajectory, _ = episode(qwen3_5_tokenizer, lead)
    assert not trajectory.token_view_valid and "not finite" in trajectory.token_view_note
    assert all(math.isfinite(x) for x in trajectory.response_logprobs)
