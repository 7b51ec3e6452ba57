"""Alternative ParSer subagents (paper Table 5) inside the real episode engine.

    .venv/bin/pytest tests/test_dci_reader_on_cpu.py -q

The lead and the subagents are one scripted model (tests/scripted_lead.ScriptedModel: only the model is faked); the engine,
gather, chunking, the DCI sandbox and its grep processes are real. The DCI subagent greps its
own chunk for the queried name and replies with JSON only when its chunk holds it, so the
lead's observation must contain exactly the chunks that mention the name.
"""
from __future__ import annotations

import asyncio
import json
import re

import pytest

from parser.text.chunking import chunk_document
from parser.serving.backends.models import Models
from parser.base.config import episode_section
from parser.methods import Sample
from parser.methods.parser import ParSerMethod
from parser.engine.readers import DCIReader, ThinkingReader
from scripted_lead import ScriptedModel


@pytest.fixture(scope="module")
def sample():
    from data_prep.synthetic_world import build_synthetic_eval

    row = build_synthetic_eval(num_questions=1, lengths=(30,), seed=5)[0]
    return Sample.from_record(row)


def test_parser_with_dci_subagents_finds_the_right_chunks(sample, tiny_tokenizer):
    name = sample.context.split("\n")[1]  # the first paragraph's title: an entity of the world
    query_call = f'<tool_call>{{"name": "query_agents", "arguments": {{"query": "Who is {name}?"}}}}</tool_call>'

    def script(text, index):  # token-id prompts (ScriptedModel checks): lead and DCI subagents both run in the engine
        if "query_agents" in text:  # the lead (its system prompt offers query_agents)
            return "</think><answer>done</answer>" if "<tool_response>" in text else "plan</think>" + query_call
        if "Query: Who is" in text and "<tool_response>" not in text:  # a DCI subagent's first turn
            return f'</think><tool_call>{{"name": "bash", "arguments": {{"command": "grep -rl \'{name}\' ."}}}}</tool_call>'
        hits = re.findall(r"doc_(\d+)\.txt", text.rsplit("<tool_response>", 1)[-1])
        if hits:
            return json.dumps({"evidence": f"Document {int(hits[0])}", "answer": f"found in doc {int(hits[0])}"})
        return '{"answer": "unknown"}'

    model = ScriptedModel(script, tiny_tokenizer, sent="ids")
    models = Models(model, tiny_tokenizer, model, tiny_tokenizer)
    method = ParSerMethod(models, episode={"chunk_size": 600, "max_turns": 3, "lead_temperature": 0.0},
                          reader={"_target_": "parser.engine.readers.DCIReader", "episode": episode_section("dci_reader")})
    result = asyncio.run(method.run(sample))
    chunks = chunk_document(sample.context, tiny_tokenizer, 600)
    holding = {c.index for c in chunks if name in c.text}
    query = result.trace.turns[0].queries[0]
    assert result.answer == "done" and result.steps == 2 and len(chunks) > 2
    assert 0 < len(holding) < len(chunks)  # some chunks hold the name, others must stay silent
    reported = {int(a.split("_")[1]) for f in query.findings for a in [f.agent, *f.merged_agents]}
    assert reported == holding
    subagent_keys = {k for k, p in zip(model.routing_keys, model.prompts, strict=True) if "query_agents" not in p}
    assert subagent_keys == {f"{sample.id}:{c.index}" for c in chunks}  # each chunk's turns pinned to its key
    root = method.reader.root
    assert root.exists() and not any(root.iterdir())  # the sample's chunk corpora are gone
    asyncio.run(method.aclose())
    assert not root.exists()


def test_dci_reader_reuses_one_corpus_per_chunk(sample, tiny_tokenizer):
    model = ScriptedModel(lambda text, index: '{"answer": "unknown"}', tiny_tokenizer)
    reader = DCIReader(model, tiny_tokenizer, episode=episode_section("dci_reader"))
    chunk = chunk_document(sample.context, tiny_tokenizer, 600)[1]
    for query in ("a?", "b?"):
        reply = asyncio.run(reader.read(query, chunk, "doc-1"))
        assert reply.text == '{"answer": "unknown"}' and reply.completion_tokens > 0
    assert len(reader._sandboxes) == 1
    files = sorted(p.name for p in next(iter(reader._sandboxes.values())).root.iterdir())
    assert files == [f"doc_{i:05d}.txt" for i in chunk.paragraph_ids]
    reader.close()


def test_thinking_reader_hands_gather_only_the_reply(tiny_tokenizer):
    from parser.text.chunking import Chunk
    from parser.engine.gather import parse_reply

    chunk = Chunk(0, "Document 1:\nLake Y\nLake Y lies north.", (1,), 10)
    replies = iter([
        'Maybe {"answer": "guess"}? No.</think>\n{"evidence": "Lake Y lies north.", "answer": "north"}',
        'thinking {"answer": "guess"} and cut off',
    ])
    model = ScriptedModel(lambda text, index: next(replies), tiny_tokenizer)
    reader = ThinkingReader(model, tiny_tokenizer)
    first = asyncio.run(reader.read("Where is Lake Y?", chunk, "d"))
    assert parse_reply(first.text) == ("north", "Lake Y lies north.")
    assert model.prompts[0].endswith("<think>\n")  # thinking is on
    second = asyncio.run(reader.read("Where is Lake Y?", chunk, "d"))
    assert second.text == "" and parse_reply(second.text) is None
