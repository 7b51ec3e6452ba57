"""Lead action parsing over both tool-call dialects. Run: .venv/bin/pytest tests/test_actions_on_cpu.py -q"""
from parser.text.actions import ToolCall, parse_lead_output, parse_tool_calls

XML_CALL = "<tool_call>\n<function=query_agents>\n<parameter=query>\n{q}\n</parameter>\n</function>\n</tool_call>"
JSON_CALL = '<tool_call>\n{{"name": "query_agents", "arguments": {{"query": "{q}"}}}}\n</tool_call>'


def test_qwen35_xml_single_and_multiple_calls():
    text = "I need the director.\n</think>\n\n" + XML_CALL.format(q="Who directed Film X?") + "\n" + XML_CALL.format(q="When was Y born?")
    action = parse_lead_output(text)
    assert action.thinking == "I need the director."
    assert action.queries == ["Who directed Film X?", "When was Y born?"]
    assert action.answer is None and action.error is None


def test_hermes_json_calls_and_stringified_arguments():
    text = "plan</think>" + JSON_CALL.format(q="Where is Z?") + '<tool_call>{"name": "query_agents", "arguments": "{\\"query\\": \\"Who is W?\\"}"}</tool_call>'
    assert parse_lead_output(text).queries == ["Where is Z?", "Who is W?"]


def test_answer_is_last_answer_after_thinking():
    text = "maybe <answer>wrong</answer> in thought</think>\n<answer>first</answer> then <answer> Final One </answer>"
    action = parse_lead_output(text)
    assert action.answer == "Final One" and action.queries == []


def test_answer_wins_over_calls_in_the_same_turn():
    text = "x</think>" + XML_CALL.format(q="q") + "<answer>42</answer>"
    assert parse_lead_output(text).answer == "42"


def test_truncated_and_garbled_output_sets_error_never_raises():
    cases = [
        "thinking that never ends",
        "x</think><tool_call>\n<function=query_agents>\n<parameter=query>\nWho dir",  # cut mid-query
        'x</think><tool_call>{"name": "query_agents", "arguments": {"query": "Who dir',  # cut mid-JSON
        "x</think><tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"a\"}}</tool_call>",  # unknown tool
        "x</think><tool_call>\n<function=query_agents>\n<parameter=query>\n\n</parameter>\n</function>\n</tool_call>",  # empty query
        "x</think><answer>unterminated",
        "x</think><tool_call>]]]{{not json</tool_call>",
        "",
    ]
    for text in cases:
        action = parse_lead_output(text)
        assert action.answer is None and action.queries == [] and action.error, text


def test_malformed_json_inside_closed_call_is_repaired():
    text = "x</think><tool_call>{'name': 'query_agents', 'arguments': {'query': 'Who is V?',}}</tool_call>"
    assert parse_lead_output(text).queries == ["Who is V?"]


def test_one_good_call_among_bad_ones_is_used():
    text = "x</think><tool_call>garbage</tool_call>" + XML_CALL.format(q="ok?")
    action = parse_lead_output(text)
    assert action.queries == ["ok?"] and action.error is None


def test_parse_tool_calls_reads_any_tool_in_both_dialects():
    xml = "<tool_call>\n<function=bash>\n<parameter=command>\nrg -n 'Anna'\n</parameter>\n</function>\n</tool_call>"
    hermes = '<tool_call>{"name": "read", "arguments": {"file": "doc_00001.txt", "offset": 5}}</tool_call>'
    calls, problems = parse_tool_calls("plan <tool_call>{\"name\": \"bash\"}</tool_call></think>\n" + xml + hermes)
    assert calls == [ToolCall("bash", {"command": "rg -n 'Anna'"}), ToolCall("read", {"file": "doc_00001.txt", "offset": 5})]
    assert problems == []  # the call inside the thinking is not a call
    calls, problems = parse_tool_calls('x</think><tool_call>{"name": "bash", "arguments": {"command": "rg')
    assert calls == [] and problems == ["truncated tool call"]  # strict when cut off
    calls, _ = parse_tool_calls("x</think><tool_call>{'name': 'bash', 'arguments': {'command': 'ls',}}</tool_call>")
    assert calls == [ToolCall("bash", {"command": "ls"})]  # lenient inside a closed call


def test_lead_output_keeps_only_the_offered_tools():
    text = "x</think>" + XML_CALL.format(q="q?") + '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    default = parse_lead_output(text)
    assert default.queries == ["q?"] and [c.name for c in default.calls] == ["query_agents"]
    dci = parse_lead_output(text, tool_names=("read", "bash"))
    assert dci.queries == [] and dci.calls == [ToolCall("bash", {"command": "ls"})] and dci.error is None
    only_unknown = parse_lead_output('x</think><tool_call>{"name": "bash", "arguments": {}}</tool_call>', tool_names=("read",))
    assert only_unknown.calls == [] and only_unknown.error == "unknown tool 'bash'"
    assert parse_lead_output(text, tool_names=None).calls == default.calls + dci.calls


# ---------------------------------------------------------------- the lead constraint's exclusions
def test_string_except_refuses_exactly_the_forbidden_strings():
    import re

    from parser.text.actions import string_except

    forbidden = ["Who built it?", "Who", "a.b (c)"]
    pattern = string_except(forbidden, '"\\\n<', 16)
    for text in forbidden:
        assert re.fullmatch(pattern, text) is None, text
    for text in ["Who built it", "Who built it?!", "Wh", "Whom", "a.b (c))", "a.b (d)", "x" * 16, "?"]:
        assert re.fullmatch(pattern, text), text
    for text in ["", "x" * 17, 'say "hi"', "two\nlines", " Who built it?", "Who built it? ", " padded"]:
        assert re.fullmatch(pattern, text) is None, text  # padded strings: the parser would strip them
    assert re.fullmatch(string_except([], '"', 4), "a  b") and not re.fullmatch(string_except([], '"', 4), "ab ")


def test_string_except_agrees_with_its_definition_on_random_strings():
    import random
    import re

    from parser.text.actions import string_except

    forbidden, excluded, max_len = ["ab c", "x", "a b", "b\tb", "abc ab"], '"<\n', 6  # one of max_len
    pattern = re.compile(string_except(forbidden, excluded, max_len))
    rng = random.Random(0)
    for _ in range(5000):
        text = "".join(rng.choice('abcx "\t') for _ in range(rng.randint(0, 8)))
        want = 1 <= len(text) <= max_len and not set(text) & set(excluded) and text == text.strip() and text not in forbidden
        assert (pattern.fullmatch(text) is not None) == want, repr(text)


def test_action_regex_refuses_a_repeated_query_in_both_dialects_and_xgrammar_compiles_it(tiny_tokenizer):
    import re

    from parser.engine import prompts
    from parser.text.actions import action_regex
    from parser.serving.backends.grammar import Grammars

    tools = prompts.lead_tools("v1")
    grammars = Grammars(tiny_tokenizer, len(tiny_tokenizer), {tiny_tokenizer.eos_token_id})
    for dialect, call in (("xml", XML_CALL), ("json", '<tool_call>{{"name": "query_agents", "arguments": {{"query": "{q}"}}}}</tool_call>')):
        pattern = action_regex(tools, dialect, exclude=["Who directed Film X?"])
        assert re.fullmatch(pattern, call.format(q="Who directed Film X?")) is None
        assert re.fullmatch(pattern, call.format(q="Who directed Film Y?"))
        assert re.fullmatch(pattern, "<answer>Miro Tal</answer>")
        grammars.matcher(("regex", pattern))  # the backend's grammar engine takes it


def test_action_regex_without_answer_allows_only_a_call_and_xgrammar_compiles_it(tiny_tokenizer):
    import re

    import pytest

    from parser.engine import prompts
    from parser.text.actions import action_regex
    from parser.serving.backends.grammar import Grammars

    tools = prompts.lead_tools("v1")
    grammars = Grammars(tiny_tokenizer, len(tiny_tokenizer), {tiny_tokenizer.eos_token_id})
    for dialect, call in (("xml", XML_CALL), ("json", '<tool_call>{{"name": "query_agents", "arguments": {{"query": "{q}"}}}}</tool_call>')):
        pattern = action_regex(tools, dialect, answer=False)
        assert re.fullmatch(pattern, "<answer>Miro Tal</answer>") is None
        assert re.fullmatch(pattern, call.format(q="Who directed Film X?"))
        grammars.matcher(("regex", pattern))
    with pytest.raises(ValueError, match="no tools offered and no answer allowed"):
        action_regex([], "json", answer=False)


def test_compiled_lead_grammars_stay_within_their_byte_bound(tiny_tokenizer):
    """Every lead turn under `distinct_queries` compiles a regex no turn compiled before. Kept
    without a bound (xgrammar's default), a 32-question run with a Qwen2.5 lead (151K vocabulary,
    ~280 MB a grammar) was OOM-killed at 24 GB; here a ~1K-token tokenizer and a bound of three
    grammars stand in for that vocabulary and `GRAMMAR_CACHE_BYTES`."""
    import torch

    from parser.engine import prompts
    from parser.text.actions import action_regex
    from parser.serving.backends.grammar import Grammars

    tools = prompts.lead_tools("v1")
    stops = {tiny_tokenizer.eos_token_id}
    sizing = Grammars(tiny_tokenizer, len(tiny_tokenizer), stops)
    sizing.matcher(("regex", action_regex(tools, "json", exclude=["Who directed Film 10?"])))
    one = sizing.cache_bytes()
    assert one > 0
    sizing.matcher(("regex", action_regex(tools, "json", exclude=["Who directed Film 10?"])))
    assert sizing.cache_bytes() == one  # a spec compiled before comes from the cache
    grammars = Grammars(tiny_tokenizer, len(tiny_tokenizer), stops, cache_bytes=3 * one)
    for turn in range(12):
        pattern = action_regex(tools, "json", exclude=[f"Who directed Film {turn + 10}?"])
        grammars.matcher(("regex", pattern)).mask(torch.zeros(len(tiny_tokenizer)))
        assert grammars.cache_bytes() <= 3 * one, turn


def test_a_constrained_query_holds_no_tool_call_debris(tiny_tokenizer):
    """SmolLM2 under the lead constraint once sent `Reketh Hefeirk}}}22 of 14 agents` as a query:
    braces, brackets, angle brackets, bars and backslashes are no part of a question, so the
    constraint's query holds none of them (QUERY_DEBRIS), in both dialects; xgrammar compiles it."""
    import re

    import xgrammar

    from parser.engine import prompts
    from parser.text.actions import action_regex

    tools = prompts.lead_tools(prompts.DEFAULT_VERSION)
    for dialect, wrap in (("json", '<tool_call>{{"name": "query_agents", "arguments": {{"query": "{}"}}}}</tool_call>'),
                          ("xml", "<tool_call>\n<function=query_agents>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>")):
        pattern = action_regex(tools, dialect)
        assert re.fullmatch(pattern, wrap.format("Who directed Film X, and when?"))
        for debris in ("Reketh Hefeirk}}}22", "a [b]", "x <y", "p | q", "back\\slash", "{name"):
            assert not re.fullmatch(pattern, wrap.format(debris)), (dialect, debris)
        only_answer = action_regex(tools, dialect, call=False)
        assert not re.fullmatch(only_answer, wrap.format("Who directed Film X?"))
        assert re.fullmatch(only_answer, "<answer>Miro Tal</answer>")
        info = xgrammar.TokenizerInfo.from_huggingface(tiny_tokenizer)
        xgrammar.GrammarCompiler(info).compile_regex(pattern)
