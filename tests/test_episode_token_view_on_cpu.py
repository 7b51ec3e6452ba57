"""The training token view, checked against the real Qwen3.5 tokenizer and chat template.

Only the model is scripted (the outer edge); prompts, parsing, gather, observation rendering
and the token bookkeeping are the real engine. Run:
    .venv/bin/pytest tests/test_episode_token_view_on_cpu.py -q
"""
import asyncio
import itertools

import pytest

from parser.engine import prompts
from parser.text.chunking import chunk_document, render_paragraphs
from parser.base.config import EpisodeConfig
from parser.engine.episode import EpisodeEngine
from parser.engine.tools import ReaderReply
from scripted_lead import ScriptedLead

CALL = "<tool_call>\n<function=query_agents>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"
SCRIPT = [
    # turn 1: two independent queries in one turn
    ("Two facts are needed.\n</think>\n\n" + CALL.format("Who directed Zorvan?") + "\n" + CALL.format("When was Miro Tal born?"), "stop"),
    # turn 2: cut at the token limit, mid-thought (no end-of-turn token)
    ("I should double-check the director because", "length"),
    # turn 3: neither a call nor an answer -> invalid-action hint
    ("Done thinking.\n</think>\n\nThe director is Miro Tal.", "stop"),
    # turn 4: the answer
    ("So the answer follows.\n</think>\n\n<answer>Miro Tal</answer>", "stop"),
]


class ScriptedReader:
    async def read(self, query, chunk, doc_id):
        if "directed" in query and 2 in chunk.paragraph_ids:
            return ReaderReply('{"evidence": "Zorvan is a film directed by Miro Tal.", "answer": "Miro Tal"}')
        if "born" in query and 3 in chunk.paragraph_ids:
            return ReaderReply('{"evidence": "Miro Tal (born 3 May 1950)", "answer": "3 May 1950"}')
        return ReaderReply('{"answer": "unknown"}')


@pytest.fixture(scope="module")
def episode(qwen3_5_tokenizer):
    paragraphs = [f"Filler {i}\nNothing about films here, only weather number {i}." for i in range(1, 9)]
    paragraphs[1] = "Zorvan\nZorvan is a film directed by Miro Tal."
    paragraphs[2] = "Miro Tal\nMiro Tal (born 3 May 1950) is a fictional director."
    chunks = chunk_document(render_paragraphs(paragraphs), qwen3_5_tokenizer, 40)
    lead = ScriptedLead(qwen3_5_tokenizer, SCRIPT, logprob=-0.5)
    engine = EpisodeEngine(lead, qwen3_5_tokenizer, ScriptedReader(), EpisodeConfig())
    trajectory = asyncio.run(engine.run("Who directed Zorvan and when was the director born?", chunks, doc_id="d0"))
    return trajectory, lead, qwen3_5_tokenizer


def test_initial_prompt_is_the_template_with_tools_and_question_only(episode):
    trajectory, lead, tok = episode
    expected = tok.apply_chat_template(
        [{"role": "system", "content": prompts.render("lead_system")},
         {"role": "user", "content": prompts.render("lead_user", question=trajectory.question)}],
        tools=prompts.lead_tools(), tokenize=False, add_generation_prompt=True, enable_thinking=True,
    )
    assert tok.decode(trajectory.prompt_ids) == expected
    assert expected.endswith("<|im_start|>assistant\n<think>\n")
    assert "Zorvan is a film" not in expected  # the lead never sees document text


def test_each_turn_prompt_extends_the_previous_stream(episode):
    trajectory, lead, _ = episode
    stream = trajectory.prompt_ids + trajectory.response_ids
    assert len(lead.prompts) == 4 and trajectory.answer == "Miro Tal" and trajectory.stop_reason == "answer"
    for earlier, later in itertools.pairwise(lead.prompts):
        assert later[: len(earlier)] == earlier
    for prompt, generated in zip(lead.prompts, lead.generated, strict=True):
        assert stream[: len(prompt)] == prompt
        assert stream[len(prompt): len(prompt) + len(generated)] == generated


def test_mask_is_one_exactly_on_generated_tokens(episode):
    trajectory, lead, tok = episode
    offset = len(trajectory.prompt_ids)
    expected_mask = [0] * len(trajectory.response_ids)
    for prompt, generated in zip(lead.prompts, lead.generated, strict=True):
        start = len(prompt) - offset
        expected_mask[start: start + len(generated)] = [1] * len(generated)
    assert trajectory.response_mask == expected_mask
    assert sum(trajectory.response_mask) == sum(len(g) for g in lead.generated)
    assert [lp for lp, m in zip(trajectory.response_logprobs, trajectory.response_mask, strict=True) if m] == [-0.5] * sum(trajectory.response_mask)
    assert all(lp == 0.0 for lp, m in zip(trajectory.response_logprobs, trajectory.response_mask, strict=True) if not m)


def _segments(trajectory):
    """The mask-0 runs of the response, decoded."""
    runs, current = [], []
    for token, mask in zip(trajectory.response_ids, trajectory.response_mask, strict=True):
        if mask == 0:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs


def test_observation_equals_template_rendering_of_the_tool_turn(episode):
    trajectory, _, tok = episode
    tool_turn = trajectory.turns[0]
    observations = [q.observation for q in tool_turn.queries]
    assert "[agent_" in observations[0] and "Miro Tal" in observations[0] and "3 May 1950" in observations[1]
    expected = "\n<|im_start|>user\n" + "\n".join(f"<tool_response>\n{o}\n</tool_response>" for o in observations)
    expected += "<|im_end|>\n<|im_start|>assistant\n<think>\n"
    first_observation = tok.decode(_segments(trajectory)[0])
    assert first_observation == expected
    # and it is what the template itself renders after this assistant turn
    rendered = tok.apply_chat_template(trajectory.messages[:5], tools=prompts.lead_tools(), tokenize=False,
                                       add_generation_prompt=True, enable_thinking=True)
    assert rendered.endswith(expected)


def test_truncated_turn_is_closed_before_the_observation(episode):
    trajectory, lead, tok = episode
    assert trajectory.turns[1].finish_reason == "length"
    second_gap = tok.decode(_segments(trajectory)[1])
    hint = prompts.render("invalid_action")
    assert second_gap == f"<|im_end|>\n<|im_start|>user\n{hint}<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert trajectory.turns[1].action_error and trajectory.turns[2].action_error


def test_turn_records_and_stats(episode):
    trajectory, _, _ = episode
    stats = trajectory.stats()
    assert stats["num_turns"] == 4 and stats["invalid_actions"] == 2
    assert stats["queries_per_turn"] == 0.5 and stats["subagent_failures"] == 0
    assert trajectory.turns[0].queries[0].findings[0].evidence == "Zorvan is a film directed by Miro Tal."


def test_templates_without_tool_support_get_the_tools_as_text(qwen3_5_tokenizer):
    """A chat template that ignores `tools=` (SmolLM2's, say) still tells the model the call format."""
    import copy

    from parser.text.chat_format import CHATML
    from parser.engine.episode import LeadContext
    from parser.engine.protocol import protocol_for
    from parser.engine.tools import QueryAgents

    plain = copy.copy(qwen3_5_tokenizer)
    plain.chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" \
                          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    config = EpisodeConfig()
    chunks = chunk_document("Document 1:\nA\nText.", qwen3_5_tokenizer, 64)
    toolset = QueryAgents(ScriptedReader(), chunks, "d", config, protocol_for(config), asyncio.Semaphore(1), plain.encode)
    for tokenizer, expect_fallback in ((plain, True), (qwen3_5_tokenizer, False)):
        context = LeadContext(tokenizer, toolset, "Who?", config, CHATML)
        system = context.messages[0]["content"]
        assert ('"name": "query_agents"' in system) is expect_fallback
        assert ("<tool_call>{" in system) is expect_fallback


def test_subagent_prompt_frames_render_exactly_like_the_template(qwen3_5_tokenizer, tiny_tokenizer):
    """The reader reuses each chunk's rendered frame across queries; it must equal a full render."""
    from parser.text.chunking import Chunk
    from parser.engine.readers.subagent import SubagentReader, render_chat

    chunk = Chunk(3, "Document 4:\nZorvan\nZorvan is a film {with braces} directed by Miro Tal.", (4,), 20)
    for tokenizer in (qwen3_5_tokenizer, tiny_tokenizer):
        reader = SubagentReader(None, tokenizer)
        for query in ["Who directed Zorvan?", "Wer hat «Zorvan» gedreht? {x}", "multi\nline query", "Query: nested"]:
            content = prompts.render("subagent", chunk=chunk.text, query=query)
            expected = render_chat(tokenizer, [{"role": "user", "content": content}], enable_thinking=False)
            assert reader.prompt(query, chunk) == expected
        assert reader._frame.cache_info().misses == 1  # one frame render for four queries


def test_a_prompt_from_state_is_tokenised_once_per_turn(qwen3_5_tokenizer):
    """RLM's and LongHarness's prompt from state was rendered and tokenised twice a turn: once
    for `measure` (its length) and again by `prompt` to send it. The measured ids are sent, and a
    prompt that is not the one measured last (the caller changed it) is still tokenised afresh."""
    import copy

    from parser.text.chat_format import CHATML
    from parser.engine.episode import LeadContext
    from parser.engine.protocol import protocol_for
    from parser.engine.tools import QueryAgents

    counted, encoded = copy.copy(qwen3_5_tokenizer), []
    counted.encode = lambda text, **kwargs: encoded.append(text) or qwen3_5_tokenizer.encode(text, **kwargs)
    config = EpisodeConfig()
    chunks = chunk_document("Document 1:\nA\nText.", qwen3_5_tokenizer, 64)
    toolset = QueryAgents(ScriptedReader(), chunks, "d", config, protocol_for(config), asyncio.Semaphore(1), counted.encode)
    context = LeadContext(counted, toolset, "Who?", config, CHATML)

    def expected(messages):
        text = qwen3_5_tokenizer.apply_chat_template(messages, tools=context.tools, tokenize=False,
                                                     add_generation_prompt=True, enable_thinking=config.lead_thinking)
        return qwen3_5_tokenizer.encode(text, add_special_tokens=False)

    shown = [{"role": "system", "content": "S"}, {"role": "user", "content": "state after round 1"}]
    encoded.clear()
    length = context.measure(shown)
    context.replace_messages(shown)
    assert context.prompt() == expected(shown) and length == len(expected(shown)) and len(encoded) == 1
    shown[1]["content"] = "state after round 2"  # changed after it was measured: the kept ids are not its
    context.replace_messages(shown)
    assert context.prompt() == expected(shown) and len(encoded) == 2
    assert context.prompt(with_tools=False) != context.prompt() and len(encoded) == 4
