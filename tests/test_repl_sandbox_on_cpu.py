"""The RLM REPL sandbox: cells persist, sub-calls round-trip, and model code cannot get out.

    .venv/bin/pytest tests/test_repl_sandbox_on_cpu.py -q

Real worker processes (parser/engine/sandbox/repl_worker.py) under the real isolation; the only fake
is the `llm` callback, which stands in for the method's sub-call backend (gateway, retries, slots).
"""
from __future__ import annotations

import asyncio
import dataclasses

import pytest
from omegaconf import OmegaConf

from parser.engine.sandbox.repl import CONFIG, ReplLimits, ReplSandbox, SubCall


class ScriptedLlm:
    """The method's `llm` callback: records each call, replies by rule (a prompt starting "fail" gets the
    "Error: ..." string the method returns for a failed sub-call)."""

    def __init__(self):
        self.calls: list[tuple[list[str], str | None]] = []

    async def __call__(self, prompts, model):
        self.calls.append((list(prompts), model))
        return [f"Error: Request failed: {p}" if p.startswith("fail") else f"reply to {p}" for p in prompts]


def run(coro):
    return asyncio.run(coro)


async def cells(context, *codes, llm=None, **options):
    async with await ReplSandbox.start(context, llm=llm or ScriptedLlm(), **options) as repl:
        return [await repl.run(code) for code in codes]


def test_yaml_is_the_dataclass_defaults():
    assert OmegaConf.to_container(OmegaConf.load(CONFIG)) == dataclasses.asdict(ReplLimits())


@pytest.mark.parametrize("field, value", [("cell_timeout_s", 0), ("cell_timeout_s", float("inf")),
                                          ("processes", 1), ("memory_bytes", True), ("output_chars", 1.5)])
def test_limits_out_of_domain_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"sandbox.{field}"):
        ReplLimits(**{field: value})


def test_variables_persist_and_are_listed_as_rlms_lists_them():
    first, second, third = run(cells("the document", "x = len(context)\nprint(x)", "y = x + 1\nprint(y, SHOW_VARS())",
                                     "import re\nz = re.findall('o', context)"))
    assert first.stdout == "12\n" and first.variables == ("answer", "context_0", "context", "x")
    # SHOW_VARS shows the names kept so far: rlms keeps a cell's new names only once it has finished
    assert second.stdout == "13 Available variables: {'f': 'TextIOWrapper', 'context_0': 'str', 'context': 'str', 'x': 'int'}\n"
    assert third.variables == ("answer", "context_0", "context", "x", "y", "z")  # the module `re` is not listed
    assert not any(cell.lost_state or cell.stderr for cell in (first, second, third))


def test_a_dict_context_is_loaded_as_rlms_loads_it():
    cell, = run(cells({"a": [1, 2], 3: "x"}, "print(context, json.dumps(context_0))"))
    assert cell.stdout == "{'a': [1, 2], '3': 'x'} {\"a\": [1, 2], \"3\": \"x\"}\n"  # json.load: str keys


def test_sub_calls_round_trip_and_a_failure_reaches_the_cell_as_its_error_string():
    llm = ScriptedLlm()
    cell, = run(cells("c", "a = llm_query('one')\nb = llm_query_batched(['two', 'fail three'], model='m')\n"
                           "c = rlm_query('four')\nprint(a, b, c, sep='|')", llm=llm))
    assert cell.stdout == "reply to one|['reply to two', 'Error: Request failed: fail three']|reply to four\n"
    assert llm.calls == [(["one"], None), (["two", "fail three"], "m"), (["four"], None)]
    assert cell.sub_calls == (SubCall(("one",), None, ("reply to one",)),
                              SubCall(("two", "fail three"), "m", ("reply to two", "Error: Request failed: fail three")),
                              SubCall(("four",), None, ("reply to four",)))


def test_an_exception_becomes_stderr_as_rlms_writes_it_and_the_cell_keeps_nothing():
    failing, after = run(cells("c", "import sys\nprint('out')\nprint('err', file=sys.stderr)\nlost = 1\n1/0",
                               "print('lost' in SHOW_VARS())"))
    assert (failing.stdout, failing.stderr) == ("out\n", "err\n\nZeroDivisionError: division by zero")
    assert after.stdout == "False\n"  # rlms keeps a failing cell's new names only when it finishes


@pytest.mark.parametrize("code", ["answer['content'] = 'Edda'\nanswer['ready'] = True",
                                  "answer = {'content': 'Edda', 'ready': True}"])
def test_answer_ready_is_the_final_answer(code):
    done, later = run(cells("c", code, "print(type(answer).__name__, answer['content'])"))
    assert done.final_answer == "Edda" and later.final_answer is None
    assert later.stdout == "AnswerDict Edda\n"


def test_aclose_is_idempotent_and_a_closed_sandbox_refuses_cells():
    async def scenario():
        repl = await ReplSandbox.start("c", llm=ScriptedLlm())
        await repl.aclose()
        await repl.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await repl.run("1")

    run(scenario())
