"""InfMem's own rules, restated from its evaluation code: how a planner reply is read (function calls
and the STOP check), how a call's arguments become a query and a top-k, how the early-stop counter
moves, and how the final answer is extracted.

Why a module of its own: these rules decide what the released checkpoint (`ucmp137538/infmem-4B`)
sees and how it is scored, so each is written once here, restated (never copied) from the authors'
code and pinned by cases with the authors' output (`tests/test_infmem_fidelity_on_cpu.py`);
docs/fidelity.md, section "InfMem", names each source. Source: UCMP13753/InfMem @ 26f1766,
`taskutils/memory_eval/utils/infmem.py` (`_parse_function_calls_from_text`, `_parse_response`,
`_clamp_top_k`, `_normalize_query`, `async_query_llm_multi_turn`) and `ruler_hqa.py` (`get_pred`).

    from parser.methods.infmem.rules import parse_plan
    parse_plan('✿FUNCTION✿: retrievesearch\\n✿ARGS✿: {"query": "Who?"}')   # Plan(calls=[...], stop=False)
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from parser.methods.memagent.rules import after_thinking, recurrent_answer

# Qwen-Agent's function-calling markers (qwen_agent.llm.fncall_prompts.qwen_fncall_prompt)
FN_NAME, FN_ARGS, FN_RESULT, FN_EXIT = "✿FUNCTION✿", "✿ARGS✿", "✿RESULT✿", "✿RETURN✿"
TOOL = "retrievesearch"
STOP = "STOP"
# the text their two-stage call appends when the thinking budget ran out before `</think>`
FORCED_THINK_END = "\n\nConsidering the limited time, I must stop thinking now.\n</think>\n\n"

_CALL = re.compile(f"{re.escape(FN_NAME)}:\\s*([^\\n]+)\\s*{re.escape(FN_ARGS)}:\\s*([^✿]+?)"
                   f"(?={re.escape(FN_RESULT)}|{re.escape(FN_EXIT)}|{re.escape(FN_NAME)}|$)", re.DOTALL)
_STRICT_STOP = re.compile(r"\bSTOP\b")


@dataclasses.dataclass(frozen=True)
class Plan:
    """A planner reply as read: its function calls, (name, raw arguments) in order, and whether it
    said STOP (then no call is read)."""

    calls: list[tuple[str, str]]
    stop: bool


def trim_arguments(args: str) -> str:
    """Their `_remove_trailing_comment_of_fn_args` (Qwen-Agent's): stripped; a JSON object cut after
    its last `}`; a code fence cut after its last line-starting ```."""
    args = args.strip()
    if args.startswith("{"):
        end = args.rfind("}")
        if end > 0:
            args = args[: end + 1]
    if args.startswith("```"):
        end = args.rfind("\n```")
        if end > 0:
            args = args[: end + 4]
    return args


def parse_plan(reply: str, strict: bool = False) -> Plan:
    """Their `_parse_function_calls_from_text` as `_parse_response` uses it: "STOP" anywhere in the
    reply, thinking included, is a stop and no call is read; else every `✿FUNCTION✿: name` then
    `✿ARGS✿: args` up to the next marker or the end (the thinking searched too).

    `strict` (the project's option, off by default): only the text after the last `</think>` is
    read, and it stops only with the word STOP and no call, so a thinking that considers stopping
    or a query that mentions "STOP" does not end the reading."""
    if strict:
        reply = reply.rsplit("</think>", 1)[-1]
    elif STOP in reply:
        return Plan([], True)
    calls = [(m.group(1).strip(), trim_arguments(m.group(2).strip())) for m in _CALL.finditer(reply)]
    return Plan(calls, strict and not calls and _STRICT_STOP.search(reply) is not None)


def normalize_query(query: Any, fallback: str) -> str:
    """Their `_normalize_query` (the enhanced retrieval): runs of CR/LF/tab become one space, the
    query is stripped and its whitespace runs collapsed; a non-string or empty query is `fallback`
    (the question)."""
    if not isinstance(query, str):
        return fallback
    query = re.sub(r"\s+", " ", re.sub(r"[\r\n\t]+", " ", query).strip())
    return query or fallback


def clamp_top_k(top_k: Any, default: int = 8, low: int = 3, high: int = 20) -> int:
    """Their `_clamp_top_k`: `int(top_k)` (so "5" is 5, 5.7 is 5, True is 1, "3.5" fails), `default`
    when that fails, then clamped to [low, high]."""
    try:
        top_k = int(top_k)
    except Exception:  # theirs catches everything int() can raise (ValueError, TypeError, OverflowError)
        top_k = default
    return max(low, min(high, top_k))


def call_arguments(raw: str, question: str, default_top_k: int) -> tuple[Any, Any]:
    """(query, top_k) of one `retrievesearch` call as their loop reads it: `json.loads`, then
    `args.get("query", question)` and `args.get("top_k", default_top_k)`, both as written (the
    retrieval normalises them); arguments that are not a JSON object give (question, default)."""
    try:
        args = json.loads(raw)
        return args.get("query", question), args.get("top_k", default_top_k)
    except Exception:  # theirs: a bare except around json.loads and .get (a JSON list or number fails .get)
        return question, default_top_k


def stop_count(count: int, plan: Plan) -> int:
    """Their early-stop counter after one plan: reset by any plan that did not say STOP, then one
    more for a plan that said STOP or made no call. So STOP, STOP, STOP stops at 3, while plans
    with neither a call nor STOP never pass 1."""
    count = count if plan.stop else 0
    return count + 1 if plan.stop or not plan.calls else count


def prediction(reply: str) -> str | None:
    """The prediction `ruler_hqa.py` `get_pred` scores for `--api infmem`: the loop keeps
    `extract_solution(generation)` (the text after the last `</think>`), the scorer strips it and
    takes the text after the last case-sensitive "the answer is" (MemAgent's `extract_answer`).
    Unlike MemAgent's `prediction`, an empty answer part never falls back to the thinking."""
    return recurrent_answer(after_thinking(reply).strip())
