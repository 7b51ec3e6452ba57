"""Every baseline end to end on the synthetic world with a tiny random-weight Qwen3.5 in process,
and the critical-path claim: the sequential readers' steps (MemAgent, Chain-of-Agents in any
order) grow with the chunks, ParSer's do not.

    .venv/bin/pytest tests/test_baselines_tiny_on_cpu.py -q

Answers are noise (random weights); what is checked is that each method runs the real
pipeline on real chunks and reports the shared result fields.
"""
from __future__ import annotations

import asyncio
import json

import pytest

from parser.serving.backends.models import Models
from parser.base.config import episode_section
from parser.methods import MethodResult, Sample, method_config
from parser.methods.coa import ChainOfAgentsMethod
from parser.methods.dci import DCIAgentMethod
from parser.methods.full_context import FullContextMethod
from parser.methods.memagent import MemAgentMethod
from parser.methods.parser import ParSerMethod
from parser.methods.rag import AgenticRAGMethod
from parser.methods.rememr1 import ReMemR1Method

SHORT = {"max_tokens_per_turn": 12}
PARSER_EPISODE = {"max_turns": 2, "max_tokens_per_turn": 12, "chunk_size": 1500}


@pytest.fixture(scope="module")
def samples():
    from data_prep.synthetic_world import build_synthetic_eval

    rows = build_synthetic_eval(num_questions=1, lengths=(10, 40), seed=1)
    return {row["length"]: Sample.from_record(row) for row in rows}


@pytest.fixture()
def models(tiny_backend, tiny_tokenizer):
    return Models(tiny_backend, tiny_tokenizer, tiny_backend, tiny_tokenizer)


# report label -> (the method's class, its config section); the ParSer variants are config only. The
# agentic baselines get their episode section composed by Hydra, as their method configs compose it.
METHODS = {
    "full_context": (FullContextMethod, {"max_new_tokens": 12, "followup_max_new_tokens": 8, "max_context_tokens": 100_000}),
    "memagent": (MemAgentMethod, {"chunk_size": 1500, "max_memory_tokens": 12, "max_answer_tokens": 8}),
    "rememr1": (ReMemR1Method, {"chunk_size": 1500, "max_memory_tokens": 12, "max_answer_tokens": 8}),
    "coa_cl": (ChainOfAgentsMethod, {"chunk_size": 1500, "max_summary_tokens": 12, "max_answer_tokens": 8, "order": "chow_liu",
                                     "scorer": {"embedder": {"model": "minilm"}}}),
    "rag": (AgenticRAGMethod, {"chunk_size": 1024, "embedder": {"model": "minilm"}, "episode": method_config("rag", episode={"max_turns": 2, **SHORT})["episode"]}),
    "dci": (DCIAgentMethod, {"episode": episode_section("dci", max_turns=2, **SHORT)}),
    "parser_thinking": (ParSerMethod, {"episode": PARSER_EPISODE, "reader": {"_target_": "parser.engine.readers.ThinkingReader", "max_new_tokens": 12}}),
    "parser_dci": (ParSerMethod, {"episode": PARSER_EPISODE,
                                  "reader": {"_target_": "parser.engine.readers.DCIReader", "episode": episode_section("dci_reader", max_turns=1, **SHORT)}}),
}
SEQUENTIAL_CLASSES = {"memagent": MemAgentMethod, "coa": ChainOfAgentsMethod}


@pytest.mark.parametrize("label", sorted(METHODS))
def test_each_method_runs_end_to_end_with_a_tiny_model(label, samples, models):
    cls, cfg = METHODS[label]
    method = cls(models, **cfg)
    result = asyncio.run(method.run(samples[10]))
    asyncio.run(method.aclose())
    assert isinstance(result, MethodResult) and result.steps >= 1 and result.wall_s > 0
    assert result.answer is None or isinstance(result.answer, str)
    assert result.lead_output_tokens > 0
    json.dumps(result.to_dict())  # the eval row is plain JSON


SEQUENTIAL = {
    "memagent": {"max_memory_tokens": 8},
    "coa": {"max_summary_tokens": 8},
    "coa_cl": {"max_summary_tokens": 8, "order": "chow_liu", "scorer": {"_target_": "parser.engine.scorers.BM25Scorer.from_config"}},
}


@pytest.mark.parametrize("label", sorted(SEQUENTIAL))
def test_sequential_steps_grow_with_chunks_parser_steps_do_not(label, samples, models):
    sequential = SEQUENTIAL_CLASSES[label.removesuffix("_cl")](models, chunk_size=400, max_answer_tokens=8, **SEQUENTIAL[label])
    episode = {"max_turns": 3, "max_tokens_per_turn": 12, "subagent_max_tokens": 8, "chunk_size": 400}
    parser = ParSerMethod(models, episode=episode)
    rows = {}
    for length, sample in samples.items():
        seq = asyncio.run(sequential.run(sample))
        par = asyncio.run(parser.run(sample))
        assert sorted(seq.trace.reading_order) == list(range(seq.trace.num_chunks))  # every chunk once
        rows[length] = (seq.trace.num_chunks, seq.steps, par.trace.num_chunks, par.steps)
    (c_short, m_short, pc_short, p_short), (c_long, m_long, pc_long, p_long) = rows[10], rows[40]
    assert c_long >= 3 * c_short and pc_long >= 3 * pc_short  # 4x the paragraphs, ~4x the chunks
    assert m_short == c_short + 1 and m_long == c_long + 1  # one sequential step per chunk, plus the answer
    assert p_short <= 3 and p_long <= 3  # lead turns: bounded by max_turns whatever the length
    assert m_long - m_short >= c_long - c_short > p_long - p_short
