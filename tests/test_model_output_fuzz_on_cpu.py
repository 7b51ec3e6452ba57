"""Hostile model output: the parsers never raise, stay linear, and still read what they read before.

    .venv/bin/pytest tests/test_model_output_fuzz_on_cpu.py -q

The reference regexes below are the parsers' previous implementation; the property tests check
the linear `str.find` scanners give the same answers on text made of the tags that matter.
"""
import re
import time

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parser.text import actions, lenient_json

from parser.engine import gather
from parser.text.actions import parse_lead_output, parse_tool_calls
from parser.engine.gather import parse_reply

OLD_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
OLD_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
OLD_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
OLD_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)
RELEASE_FENCE = re.compile(r"```json\s*(.*?)\s*```", re.DOTALL)  # the release's, restated
RELEASE_OBJECT = re.compile(r"\{.*\}", re.DOTALL)

FRAGMENTS = ["<answer>", "</answer>", "<function=", "</function>", "<parameter=", "</parameter>", "<tool_call>",
             "</tool_call>", "</think>", "<think>", "```", "json", ">", "\n", " ", "q", "x", "{", "}", "[", "]", '"',
             "'", ":", ",", "\\", "\\ud800", "NaN", '"answer"', '"name"', '"query_agents"', '"arguments"', "1e999"]
tagged_text = st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join)
settings.register_profile("parsers", max_examples=400, deadline=None)


@settings(settings.get_profile("parsers"))
@given(tagged_text)
def test_scanners_find_what_the_regexes_found(text):
    assert actions._answers(text) == OLD_ANSWER.findall(text)
    assert list(actions._named_blocks(text, "parameter", need_close=True)) == OLD_PARAMETER.findall(text)
    old_function = OLD_FUNCTION.search(text)
    new_function = next(actions._named_blocks(text, "function", need_close=False), None)
    assert new_function == (old_function.groups() if old_function else None)
    old_fence = OLD_FENCE.search(text)
    assert gather._fenced(text) == (old_fence.group(1) if old_fence else None)


@settings(settings.get_profile("parsers"))
@given(tagged_text)
def test_parsers_never_raise_and_results_serialise(text):
    action = parse_lead_output("plan</think>" + text, tool_names=None)
    assert action.answer is not None or action.calls or action.error
    orjson.dumps([c.arguments for c in action.calls])  # deep or surrogate values would raise here
    finding = parse_reply(text)
    assert finding is None or all(isinstance(part, str) for part in finding)
    if finding:
        (finding[0] + finding[1]).encode("utf-8")


@pytest.mark.parametrize("reply", [None, 42, 3.5, True, [], {"answer": "x"}, b'{"answer": "x"}'])
def test_a_reply_that_is_not_text_is_junk(reply):
    assert parse_reply(reply) is None


@pytest.mark.parametrize("depth", [300, 400, 1500, 50_000])
def test_deep_brackets_are_an_invalid_action_not_a_crash(depth):
    for body in ("[" * depth, "{" * depth, '{"name": "query_agents", "arguments": ' + '{"query": ' * depth + '"q"' + "}" * depth + "}",
                 '{"name": "bash", "arguments": "' + "[" * depth + '"}'):
        for closed in (True, False):
            text = "x</think><tool_call>" + body + ("</tool_call>" if closed else "")
            action = parse_lead_output(text, tool_names=None)
            assert action.calls == [] and action.error, (depth, body[:40])
    for reply in ("{" * depth, '{"answer": "Paris", "evidence": ' + "[" * depth + "]" * depth + "}", "```json\n" + "[{" * depth):
        assert parse_reply(reply) is None or parse_reply(reply)[0] == "Paris"


def test_odd_json_values_come_through_encodable():
    calls, problems = parse_tool_calls('x</think><tool_call>{"name": "read", "arguments": {"file": "\\ud800a\\udfff", '
                                       '"offset": Infinity, "\\udc00": NaN}}</tool_call>')
    assert problems == [] and calls[0].arguments["file"] == "\ufffda\ufffd" and calls[0].arguments["offset"] == float("inf")
    assert "\ufffd" in calls[0].arguments
    assert parse_reply('{"answer": "\\ud83d\\ude00 \\ud800", "evidence": ["a", {"b": 1}]}') == ("\U0001F600 \ufffd", "['a', {'b': 1}]")


def test_repair_is_refused_when_it_would_be_slow():
    garbage = "{" * 64 + '"' * 8192  # json-repair: ~3 s on this before the budget
    started = time.perf_counter()
    value, problem = lenient_json.loads_lenient(garbage)
    assert value is None and "too long or too bracketed" in problem
    assert time.perf_counter() - started < 0.5
    assert lenient_json.loads_lenient("{'query': 'ok',}") == ({"query": "ok"}, None)  # cheap repairs still happen


CUT_DOCUMENTS = [  # the shapes a reply or a tool call has when a token limit cuts it
    {"evidence": 'Zorvan (1981) is a film [2] directed by Miro Tal; it won "Best" prize.\nSee: Lumen', "answer": "Miro Tal"},
    {"answer": "42", "evidence": "six times seven (a number)"},
    {"name": "query_agents", "arguments": {"query": "Who directed Zorvan?"}},
    {"name": "read", "arguments": {"file": "doc_00017.txt", "offset": 200}},
]


@pytest.mark.parametrize("document", CUT_DOCUMENTS, ids=lambda d: next(iter(d)))
def test_a_cut_value_is_closed_as_json_repair_closes_it(document):
    """Every prefix of the document, as a token limit leaves it: closed in one pass, the same value
    json-repair builds (which the release uses unbounded), whatever the text's brackets cost it.
    One form differs: a first key cut right after whitespace, which json-repair makes [] or {}
    depending on the whitespace before it."""
    import json_repair

    for text in (orjson.dumps(document).decode(), orjson.dumps(document, option=orjson.OPT_INDENT_2).decode()):
        for n in range(1, len(text)):
            prefix = text[:n]
            if re.fullmatch(r'.*\{\s+"?', prefix, re.DOTALL):
                continue
            assert lenient_json.complete_truncated(prefix) is not None
            assert lenient_json.loads_lenient(prefix)[0] == json_repair.loads(prefix), prefix


def test_a_value_that_ends_is_not_completed():
    for text in ('{"a": 1} and more', '{"a": 1]', "no json here", '"just a string', '{"a": 1}'):
        assert lenient_json.complete_truncated(text) is None, text


@settings(settings.get_profile("parsers"))
@given(tagged_text)
def test_the_release_body_is_what_its_regexes_find(text):
    fenced = RELEASE_FENCE.search(text)
    expected = fenced.group(1) if fenced else (m.group(0) if (m := RELEASE_OBJECT.search(text)) else text)
    assert gather._release_body(text) == expected


HOSTILE = {
    "unclosed <answer>": (parse_lead_output, "plan</think>", "<answer>x "),
    "<parameter= without '>'": (parse_lead_output, "x</think><tool_call>\n<function=query_agents>\n", "<parameter=q "),
    "unclosed <parameter=q>": (parse_lead_output, "x</think><tool_call>\n<function=query_agents>\n", "<parameter=query>a "),
    "<function= without '>'": (parse_lead_output, "x</think><tool_call>", "<function=f "),
    "<function= lines": (parse_lead_output, "x</think><tool_call>", "<function=f\n"),
    "quotes in a closed call": (parse_lead_output, 'x</think><tool_call>{"name": "q", "arguments": {{{', '"'),
    "nested { reply": (parse_reply, "", "{"),
    "quotes after { reply": (parse_reply, "{{{{{{{{", '"'),
    "unclosed fence of spaces": (parse_reply, "```json", " "),
    "repeated objects reply": (parse_reply, "", '{"a": [1, "b\': {'),
    "release: escapes in a cut string": (gather.parse_release_reply, '{"evidence": "', "\\n"),
    "release: brackets in a cut string": (gather.parse_release_reply, '{"evidence": "', "(["),
    "release: braces, none closed": (gather.parse_release_reply, "", "{"),
    "release: an unclosed fence of spaces": (gather.parse_release_reply, "```json", " "),
    "cut string of escapes at the completion budget": (lenient_json.loads_lenient, '{"a": "', "\\n"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_text_parses_in_linear_time(name):
    """512 KB of each; the quadratic parsers took 4-13 s on 128 KB and minutes on 1 MB."""
    parse, head, unit = HOSTILE[name]
    size = lenient_json.COMPLETE_BUDGET if "budget" in name else 512 * 1024
    text = head + unit * ((size - len(head)) // len(unit))
    started = time.perf_counter()
    parse(text + "</tool_call>" if "call" in name else text)
    assert time.perf_counter() - started < 2.0, name


# ReMemR1's own regexes (parser.methods.memagent.rules restates them in linear time; docs/fidelity.md rows 29-30)
THEIR_MEMORY = re.compile(r"<recall>.*?</recall>", re.DOTALL)
THEIR_QUERY = re.compile(r"<recall>(.+)</recall>")


@settings(settings.get_profile("parsers"))
@given(st.lists(st.sampled_from(["<recall>", "</recall>", "x", "\n", "<", ">", "recall"]), max_size=40).map("".join))
def test_memagent_recall_split_matches_the_regex(text):
    from parser.methods.memagent.rules import recall_query, remove_recalls

    query = THEIR_QUERY.search(text)
    assert remove_recalls(text) == THEIR_MEMORY.sub("", text).strip()
    assert recall_query(text) == (query.group(1) if query else None)


def test_memagent_recall_split_is_linear():
    from parser.methods.memagent.rules import recall_query, remove_recalls

    started = time.perf_counter()
    remove_recalls("<recall>x" * 60_000)  # 540 KB; the regex took 4 s on 32 KB
    recall_query("<recall>x" * 60_000)
    assert time.perf_counter() - started < 1.0
