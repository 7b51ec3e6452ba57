"""`method=rlm` against the official rlms 0.1.3, on the same scripted OpenAI-compatible server.

    .venv/bin/pytest tests/test_rlm_fidelity_on_cpu.py -q

For every case of tests/rlm_script.py (a probe turn, a batched map, cell errors, output over
20,000 characters, iterations exhausted, `answer` rebound to a dict, the consecutive-error limit)
the method must send what rlms sent: the same root message list at every turn (system prompt and
addendum, metadata, "Turn i/N" with the first-turn safeguard, the REPL output byte for byte), the
same sub-call prompts (as a multiset) and sampling fields, and give the same answer after the same
number of iterations, through the fallback call where rlms makes it; and the token ids the engine
sent are exactly rlms' message lists rendered with the lead's chat template. What rlms did is read
from tests/fixtures/rlm/ (recorded from the pinned version by scripts/record_rlm_fixtures.py), so
the comparison runs without rlms; where rlms is installed, `test_live_rlms_*` also runs it on the
same server (the sub-call, fallback and error-limit cases) and requires the fixtures to be what it
does today.

The outer edge is scripted (`rlm_script.ScriptServer` stands in for the model server); the method,
its engine, its REPL sandbox and rlms itself are real.
"""
from __future__ import annotations

import asyncio
import json

import pytest

from parser.methods.rlm.reference import PIN, load_prompts
from parser.methods.rlm.view import render
from rlm_script import CASES, FIXTURES, ScriptServer, run_ours, run_rlms, sampling

NAMES = sorted(CASES)
PROMPTS_JSON = str(FIXTURES / "prompts.json")


def recorded(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def ours(tiny_tokenizer):
    """Every case through `method=rlm` once: (result, messages per turn, root bodies, sub bodies)."""
    async def run_all():
        out = {}
        for name in NAMES:
            with ScriptServer(CASES[name], tiny_tokenizer) as server:
                result, seen = await asyncio.wait_for(run_ours(name, server, tiny_tokenizer, PROMPTS_JSON), 60)
                out[name] = (result, seen, server.roots(), server.subs())
        return out

    return asyncio.run(run_all())


def check_same(expected: dict, got: tuple, tokenizer) -> None:
    result, seen, roots, subs = got
    assert seen == expected["root_messages"]  # every turn's message list, byte for byte
    rendered = [tokenizer.encode(tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True,
                                                               enable_thinking=False), add_special_tokens=False)
                for m in expected["root_messages"]]
    assert [body["prompt"] for body in roots] == rendered  # the engine's prompt tokens are rlms' messages, rendered
    assert [sampling(body) for body in roots] == expected["root_sampling"]
    assert sorted(body["messages"][0]["content"] for body in subs) == expected["sub_prompts"]
    assert sorted({json.dumps([m["role"] for m in body["messages"]]) for body in subs}) == expected["sub_messages_shape"]
    assert sorted({json.dumps(sampling(body)) for body in subs}) == expected["sub_sampling"]
    part = result.trace.extras["rlm"]
    iterations = [it for it in part["iterations"] if not it["fallback"]]
    assert result.answer == expected["answer"]
    assert len(iterations) == expected["iterations"] and (len(part["iterations"]) > len(iterations)) == expected["fallback"]
    assert part["stop_reason"] == (expected["stop"] or ("fallback" if expected["fallback"] else "answer"))
    assert result.steps == len(roots)  # root calls on the critical path: iterations (+ the fallback)
    # per role, every call counted (rlms' own summary merges both roles under one model name)
    assert (part["usage"]["root"]["calls"], part["usage"]["sub"]["calls"]) == (len(roots), len(subs))


def test_fixtures_are_the_pinned_rlms():
    assert {recorded(name)["rlms_version"] for name in NAMES} == {PIN} == {load_prompts(PROMPTS_JSON).version}


@pytest.mark.parametrize("name", NAMES)
def test_method_sends_what_rlms_sent(name, ours, tiny_tokenizer):
    check_same(recorded(name), ours[name], tiny_tokenizer)


def test_rlms_undercounts_calls_when_roles_share_a_model_name(ours):
    """The row docs/fidelity.md states: rlms' usage summary keeps one role's counts per model name."""
    expected = recorded("batched_map")
    made = len(expected["root_messages"]) + len(expected["sub_prompts"])
    assert expected["usage_summary"]["model_usage_summaries"]["root"]["total_calls"] < made
    usage = ours["batched_map"][0].trace.extras["rlm"]["usage"]
    assert usage["root"]["calls"] + usage["sub"]["calls"] == made


def test_viewer_shows_each_iterations_code_output_and_sub_calls(ours):
    page = render(ours["batched_map"][0].trace.extras)
    assert "llm_query_batched" in page and "Who kept the lighthouse? Text: Paragraph 0" in page
    assert "Edda Krohn" in page and "Iteration 3" in page
    assert "Fallback answer call" in render(ours["iterations_exhausted"][0].trace.extras)
    assert "ZeroDivisionError" in render(ours["cell_error"][0].trace.extras)


def test_live_rlms_prompts_are_the_stand_ins():
    pytest.importorskip("rlm")
    live, standin = load_prompts("rlms"), load_prompts(PROMPTS_JSON)
    assert (live.system, live.addendum, live.user, live.version) == (standin.system, standin.addendum, standin.user, PIN)


# rlms itself, on the cases that take its sub-call and fallback paths (each rlms run costs ~0.7 s, half
# of it its LMHandler's shutdown poll; the other cases' fixtures were recorded from the same pinned version)
@pytest.mark.parametrize("name", ["batched_map", "iterations_exhausted", "max_errors"])
def test_live_rlms_does_what_its_fixture_says_and_the_method_matches_it(name, ours, tiny_tokenizer):
    pytest.importorskip("rlm")
    with ScriptServer(CASES[name], tiny_tokenizer) as server:
        live = run_rlms(name, server)
    assert live == recorded(name)
    check_same(live, ours[name], tiny_tokenizer)
