"""Parse one lead-agent generation into thinking, queries and/or a final answer.

Two tool-call dialects are accepted so the engine serves both model families:

* Qwen3.5 (XML, "qwen3_coder" style)::

    <tool_call>
    <function=query_agents>
    <parameter=query>
    Who directed Film X?
    </parameter>
    </function>
    </tool_call>

* Qwen2.5 / Qwen3 (Hermes JSON)::

    <tool_call>{"name": "query_agents", "arguments": {"query": "Who directed Film X?"}}</tool_call>

The final answer is the last ``<answer>…</answer>`` after the thinking. A generation with
neither a usable call nor an answer gets `error` set; the engine then appends the invalid-action
hint and continues (paper Algorithm 1). This module never raises on model output.
"""
from __future__ import annotations

import dataclasses
import re

import json_repair
import orjson

TOOL_NAME = "query_agents"

_THINK_END = "</think>"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


@dataclasses.dataclass
class LeadAction:
    thinking: str
    queries: list[str]
    answer: str | None
    error: str | None = None


def split_thinking(text: str) -> tuple[str, str]:
    """(thinking, rest). The generation prompt opens `<think>`, so text up to `</think>` is thinking."""
    if _THINK_END not in text:
        return "", text
    head, _, rest = text.rpartition(_THINK_END)
    return head.replace("<think>", "", 1).strip(), rest


def _parse_call(body: str, closed: bool) -> tuple[str | None, str | None]:
    """(query, problem) for one tool-call body in either dialect.

    JSON is repaired leniently only inside a closed `<tool_call>`; a call cut off by the token
    limit must parse as it stands, so a half-written query is never sent.
    """
    function = _XML_FUNCTION.search(body)
    if function:
        name = function.group(1).strip()
        params = {k.strip(): v.strip("\n") for k, v in _XML_PARAMETER.findall(function.group(2))}
        if name != TOOL_NAME:
            return None, f"unknown tool {name!r}"
        if "query" not in params:
            return None, "tool call without a complete <parameter=query> block"
        return params["query"], None
    stripped = body.strip()
    if not stripped.startswith("{"):
        return None, "tool call is neither XML nor JSON"
    try:
        call = json_repair.loads(stripped) if closed else orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return None, "truncated tool call"
    if not isinstance(call, dict):
        return None, "tool call JSON is not an object"
    name = call.get("name")
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = json_repair.loads(arguments)
    if name != TOOL_NAME:
        return None, f"unknown tool {name!r}"
    if not isinstance(arguments, dict) or not isinstance(arguments.get("query"), str):
        return None, "tool call has no string 'query' argument"
    return arguments["query"], None


def parse_lead_output(text: str) -> LeadAction:
    thinking, action = split_thinking(text)
    answers = _ANSWER.findall(action)
    if answers:
        return LeadAction(thinking, [], answers[-1].strip())
    queries, problems = [], []
    for match in _TOOL_CALL.finditer(action):
        query, problem = _parse_call(match.group(1), closed=match.group(0).endswith("</tool_call>"))
        if problem:
            problems.append(problem)
        elif query and query.strip():
            queries.append(query.strip())
        else:
            problems.append("empty query")
    if queries:
        return LeadAction(thinking, queries, None)
    if problems:
        return LeadAction(thinking, [], None, "; ".join(problems))
    if "<answer>" in action:
        return LeadAction(thinking, [], None, "unterminated <answer> block")
    return LeadAction(thinking, [], None, "no tool call and no <answer> block")
