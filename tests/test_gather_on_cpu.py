"""Gather: lenient parsing, abstentions, labels, merging, budget. Run: .venv/bin/pytest tests/test_gather_on_cpu.py -q"""
from parser.engine.gather import merge_identical, parse_reply, render_observation
from parser.records.trajectory import Finding


def words(text):
    return len(text.split())


def test_parse_reply_variants():
    assert parse_reply('{"evidence": "X was born in 1901.", "answer": "1901"}') == ("1901", "X was born in 1901.")
    assert parse_reply('```json\n{"answer": "Paris", "evidence": "in Paris"}\n```') == ("Paris", "in Paris")
    assert parse_reply("<think>hmm</think>{'answer': 'Lyon', 'evidence': 'Lyon',}") == ("Lyon", "Lyon")
    assert parse_reply('{"answer": 1901}') == ("1901", "")
    for abstention in ['{"answer": "unknown"}', '{"answer": "Unknown."}', '{"answer": ""}', "no idea", "", '{"evidence": "x"}', "[1, 2]"]:
        assert parse_reply(abstention) is None, abstention


def test_merge_identical_answers_keeps_first_agent():
    findings = [Finding("agent_1", 1, "Paris"), Finding("agent_4", 4, "paris."), Finding("agent_7", 7, "Lyon")]
    merged = merge_identical(findings)
    assert [f.agent for f in merged] == ["agent_1", "agent_7"]
    assert merged[0].merged_agents == ["agent_4"]


def test_observation_labels_agents_and_says_what_was_cut():
    findings = [Finding(f"agent_{i}", i, f"answer {i}", evidence="quote " * 20) for i in range(30)]
    text, omitted = render_observation("Who?", findings, num_agents=100, count_tokens=words, token_budget=200)
    assert omitted > 0 and f"({omitted} more findings omitted)" in text
    assert "[agent_0] answer: answer 0" in text and "30 of 100 agents" in text
    assert words(text) < 260


def test_empty_observation_says_nobody_found_anything():
    text, omitted = render_observation("Who?", [], num_agents=12, count_tokens=words, token_budget=100)
    assert omitted == 0 and "None of the 12 agents" in text
