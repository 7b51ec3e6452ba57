"""The one engine with another tool set and the baselines' options, on the real Qwen3.5 template.

Only the model is scripted; the engine, the DCI tool set, its sandbox (real `grep` processes),
the prompts and the token bookkeeping are real. Run:
    .venv/bin/pytest tests/test_episode_toolsets_on_cpu.py -q
"""
import asyncio

import pytest

from parser.engine import prompts
from parser.engine.sandbox.tools import SandboxTools
from parser.engine.sandbox.tools import Sandbox, materialize_corpus
from parser.base.config import EpisodeConfig
from parser.engine.episode import EpisodeEngine
from parser.methods.dci import PROMPTS as DCI_PROMPTS
from parser.engine.tools import TurnRules
from scripted_lead import ScriptedLead

DOCUMENT = "Document 1:\nZorvan\nZorvan is a film directed by Miro Tal.\n\nDocument 2:\nLake Y\nLake Y lies north."
GREP = "<tool_call>\n<function=bash>\n<parameter=command>\ngrep -rl Zorvan .\n</parameter>\n</function>\n</tool_call>"
READ = '<tool_call>{"name": "read", "arguments": {"file": "doc_00001.txt"}}</tool_call>'


def run_dci(tokenizer, tmp_path, script, rules=TurnRules(), **options):
    sandbox = Sandbox(materialize_corpus(DOCUMENT, tmp_path / "corpus"))
    model = ScriptedLead(tokenizer, script, logprob=-0.25)
    engine = EpisodeEngine(model, tokenizer, config=EpisodeConfig(**options))
    trajectory = asyncio.run(engine.run_tools("Who directed Zorvan?", SandboxTools(sandbox, "dci", rules=rules, templates=DCI_PROMPTS), doc_id="d", routing_key="d:0"))
    return trajectory, model


@pytest.fixture(scope="module")
def appended(qwen3_5_tokenizer, tmp_path_factory):
    script = [
        ("I will search.\n</think>\n\n" + GREP + "\n" + READ, "stop"),  # two tools in one turn
        ("The file says the director is", "length"),  # cut: continuation prompt
        ("Found it.\n</think>\n\nMiro Tal", "stop"),  # a plain reply is the answer
    ]
    trajectory, model = run_dci(qwen3_5_tokenizer, tmp_path_factory.mktemp("dci"), script,
                                TurnRules(plain_reply_is_answer=True, continue_cut_turns=True))
    return trajectory, model, qwen3_5_tokenizer


def test_other_tools_keep_the_appended_token_view(appended):
    trajectory, model, tok = appended
    assert trajectory.answer == "Miro Tal" and trajectory.stop_reason == "plain_reply" and trajectory.token_view_valid
    stream = trajectory.prompt_ids + trajectory.response_ids
    for prompt, generated in zip(model.prompts, model.generated, strict=True):
        assert stream[: len(prompt)] == prompt and stream[len(prompt): len(prompt) + len(generated)] == generated
    assert sum(trajectory.response_mask) == sum(len(g) for g in model.generated)
    first = tok.decode(trajectory.prompt_ids)
    assert DCI_PROMPTS.render("dci_system") in first and '"name": "bash"' in first and "query_agents" not in first
    assert all(k == {"request_id": "d", "routing_key": "d:0"} for k in model.kwargs)


def test_tool_results_and_continuation_are_the_templates_rendering(appended):
    trajectory, model, tok = appended
    calls = trajectory.turns[0].tool_calls
    assert [c["name"] for c in calls] == ["bash", "read"] and all(c["error"] is None for c in calls)
    results = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
    assert results[0].strip() == "./doc_00001.txt" and "Zorvan is a film directed by Miro Tal." in results[1]
    second = tok.decode(model.prompts[1][len(model.prompts[0]) + len(model.generated[0]):])
    expected = "\n<|im_start|>user\n" + "\n".join(f"<tool_response>\n{r.strip()}\n</tool_response>" for r in results)
    assert second == expected + "<|im_end|>\n<|im_start|>assistant\n<think>\n"  # the template trims contents
    rendered = tok.apply_chat_template(trajectory.messages[:5], tools=prompts.TOOLSETS.schemas("read", "bash"), tokenize=False,
                                       add_generation_prompt=True, enable_thinking=True)
    assert rendered.endswith(second)
    third = tok.decode(model.prompts[2][len(model.prompts[1]) + len(model.generated[1]):])
    assert third == f"<|im_end|>\n<|im_start|>user\n{prompts.render('continue')}<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert [t.action_error is None for t in trajectory.turns] == [True, False, True]


def test_defaults_are_parsers_behaviour(qwen3_5_tokenizer, tmp_path):
    """Without the options a plain reply is an invalid action and a cut turn gets the hint."""
    script = [("Found it.\n</think>\n\nMiro Tal", "stop"), ("thinking", "length"), ("</think><answer>Miro Tal</answer>", "stop")]
    trajectory, model = run_dci(qwen3_5_tokenizer, tmp_path, script)
    assert trajectory.stop_reason == "answer" and trajectory.num_turns == 3 and trajectory.token_view_valid
    hints = [m["content"] for m in trajectory.messages if m["role"] == "user"][1:]
    assert hints == [prompts.TOOLSETS.render("invalid_action", error="no tool call and no <answer> block"),
                     prompts.TOOLSETS.render("invalid_action", error="thinking not finished (no </think>): nothing after it to act on")]


def test_eval_only_options_rerender_and_lose_the_token_view(qwen3_5_tokenizer, tmp_path):
    script = [("a\n</think>\n\n" + READ, "stop")] * 2 + [("</think>\n\n<answer>Miro Tal</answer>", "stop")]
    trajectory, model = run_dci(qwen3_5_tokenizer, tmp_path, script,
                                TurnRules(finalize_turn=True, compact_after_chars=150, keep_recent_results=1), max_turns=2)
    assert trajectory.answer == "Miro Tal" and trajectory.stop_reason == "finalize" and trajectory.num_turns == 3
    assert not trajectory.token_view_valid
    results = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
    assert results[0] == prompts.render("compacted") and "Zorvan" in results[1]
    final = qwen3_5_tokenizer.decode(model.prompts[-1])
    assert "<tools>" not in final and prompts.render("finalize") in final and prompts.render("compacted") in final


def test_turn_rules_belong_to_the_tool_sets_not_to_verls_episode():
    """Training runs ParSer's query_agents, whose rules are Algorithm 1's: a baseline's turn rule in
    `parser.episode` is an unknown key, and a typo in a tool set's rules is refused by name."""
    pytest.importorskip("verl")
    from parser.train.worker import episode_config

    for option in ({"continue_cut_turns": True}, {"compact_after_chars": 1000}, {"finalize_turn": True}):
        with pytest.raises(ValueError, match=f"unknown key.*{next(iter(option))}"):
            episode_config(option, 512)
    with pytest.raises(ValueError, match=r"dci: episode.turn_rules: unknown turn rule\(s\) \['finalise_turn'\]"):
        TurnRules.from_section({"finalise_turn": True}, "dci: episode.turn_rules")


def test_distinct_queries_stop_a_greedy_lead_from_sending_its_query_again(tiny_qwen3_5_model, tiny_tokenizer):
    """The tiny greedy lead under the lead constraint sends one query every turn (as SmolLM2 did
    in the demo); with distinct_queries no query is sent twice, and the trajectory says so."""
    from parser.serving.backends.transformers import TransformersBackend
    from parser.text.chunking import Chunk
    from parser.engine.readers import SubagentReader

    chunks = [Chunk(0, "Zorvan is a film directed by Miro Tal.", (1,), 9), Chunk(1, "Miro Tal was born in 1950.", (2,), 8)]

    def queries(distinct: bool):
        cfg = EpisodeConfig(max_turns=3, max_tokens_per_turn=128, lead_temperature=0.0, lead_thinking=False,
                            subagent_max_tokens=8, subagent_temperature=0.0, constrain_lead=True, distinct_queries=distinct)
        backend = TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer)
        reader = SubagentReader(backend, tiny_tokenizer, max_new_tokens=8, temperature=0.0)
        trajectory = asyncio.run(EpisodeEngine(backend, tiny_tokenizer, reader, cfg).run("Who directed Zorvan?", chunks))
        return [q.query for turn in trajectory.turns for q in turn.queries], trajectory.constraints

    asked, constraints = queries(distinct=False)
    assert len(asked) > len(set(asked)), asked  # the repeat this option exists for
    asked, constraints = queries(distinct=True)
    assert len(asked) >= 2 and len(asked) == len(set(asked)), asked
    assert "lead: no query asked twice" in constraints
    with pytest.raises(ValueError, match="constrain_lead"):
        EpisodeConfig(distinct_queries=True)


def regex_recording(backend):
    """The real backend, and the list its generate appends each lead constraint (regex) to."""
    regexes, generate = [], backend.generate

    async def recording(prompt_ids, sampling, *args, **kwargs):
        if sampling.regex is not None:
            regexes.append(sampling.regex)
        return await generate(prompt_ids, sampling, *args, **kwargs)

    backend.generate = recording
    return backend, regexes


def test_query_first_refuses_an_answer_until_the_lead_has_asked(tiny_qwen3_5_model, tiny_tokenizer):
    """Under query_first the real backend decodes the first lead turn under a constraint with no
    <answer> in it (Qwen2.5-Coder-0.5B otherwise guesses at once) and every later turn under one
    with it; the trajectory records the option."""
    import re

    from parser.serving.backends.transformers import TransformersBackend
    from parser.text.chunking import Chunk
    from parser.engine.readers import SubagentReader

    chunks = [Chunk(0, "Zorvan is a film directed by Miro Tal.", (1,), 9), Chunk(1, "Miro Tal was born in 1950.", (2,), 8)]
    cfg = EpisodeConfig(max_turns=3, max_tokens_per_turn=128, lead_temperature=0.0, lead_thinking=False,
                        subagent_max_tokens=8, subagent_temperature=0.0, constrain_lead=True, query_first=True)
    backend, lead_regexes = regex_recording(TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer))
    reader = SubagentReader(backend, tiny_tokenizer, max_new_tokens=8, temperature=0.0)
    trajectory = asyncio.run(EpisodeEngine(backend, tiny_tokenizer, reader, cfg).run("Who directed Zorvan?", chunks))
    assert trajectory.turns[0].queries and trajectory.turns[0].answer is None
    assert len(lead_regexes) == len(trajectory.turns) >= 2
    answers = [re.fullmatch(r, "<answer>Miro Tal</answer>") is not None for r in lead_regexes]
    assert answers == [False] + [True] * (len(answers) - 1)
    assert "lead: a query before any answer" in trajectory.constraints
    with pytest.raises(ValueError, match="query_first is part of the lead constraint"):
        EpisodeConfig(query_first=True)


def test_answer_last_turn_makes_the_last_turn_an_answer_and_reports_every_turn(tiny_qwen3_5_model, tiny_tokenizer):
    """Under answer_last_turn the real backend decodes the episode's last lead turn under a
    constraint that holds only an <answer> (a small lead otherwise ends every CPU episode
    unanswered), after query_first made the first a call; the trajectory records the option, ends
    answered, and `parser.engine.progress` hears each turn as it finishes, in order."""
    import re

    from parser.engine import progress
    from parser.serving.backends.transformers import TransformersBackend
    from parser.text.chunking import Chunk
    from parser.engine.readers import SubagentReader

    chunks = [Chunk(0, "Zorvan is a film directed by Miro Tal.", (1,), 9), Chunk(1, "Miro Tal was born in 1950.", (2,), 8)]
    cfg = EpisodeConfig(max_turns=2, max_tokens_per_turn=128, lead_temperature=0.0, lead_thinking=False,
                        subagent_max_tokens=8, subagent_temperature=0.0, constrain_lead=True, query_first=True,
                        answer_last_turn=True)
    backend, lead_regexes = regex_recording(TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer))
    reader = SubagentReader(backend, tiny_tokenizer, max_new_tokens=8, temperature=0.0)
    heard = []

    async def episode():
        with progress.listening(lambda doc_id, turn: heard.append((doc_id, turn.index, turn.answer))):
            return await EpisodeEngine(backend, tiny_tokenizer, reader, cfg).run("Who directed Zorvan?", chunks, doc_id="d")

    trajectory = asyncio.run(episode())
    assert len(trajectory.turns) == 2 and trajectory.turns[0].queries
    assert trajectory.turns[1].answer is not None and trajectory.stop_reason == "answer"
    call = '<tool_call>\n<function=query_agents>\n<parameter=query>\nWho directed Zorvan?\n</parameter>\n</function>\n</tool_call>'
    assert [re.fullmatch(r, call) is not None for r in lead_regexes] == [True, False]
    assert [re.fullmatch(r, "<answer>Miro Tal</answer>") is not None for r in lead_regexes] == [False, True]
    assert "lead: the last turn answers" in trajectory.constraints
    assert heard == [("d", 0, None), ("d", 1, trajectory.turns[1].answer)]
    with pytest.raises(ValueError, match="answer_last_turn is part of the lead constraint"):
        EpisodeConfig(answer_last_turn=True)
    with pytest.raises(ValueError, match="max_turns >= 2"):
        EpisodeConfig(max_turns=1, constrain_lead=True, query_first=True, answer_last_turn=True)


def test_unknown_episode_keys_are_refused_with_the_nearest_name():
    with pytest.raises(ValueError, match=r"episode\.max_turn \(did you mean episode\.max_turns\?\)"):
        EpisodeConfig.from_mapping({"max_turn": 4})
    assert EpisodeConfig.from_mapping({"max_turns": 4}).max_turns == 4
