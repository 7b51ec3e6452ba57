"""Parse one agent generation into thinking, tool calls and/or a final answer.

Every tool-using agent of the project (the ParSer lead, agentic RAG, the DCI agent and the DCI
subagent) runs through `parser.episode.EpisodeEngine`, and this is the one parser it uses.
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

`parse_tool_calls` reads calls to any tool; `parse_lead_output` keeps the calls to the tools the
agent was offered (`tool_names`), and the final answer, the last ``<answer>…</answer>`` after the
thinking. A generation with neither a usable call nor an answer gets `error` set; the engine then
appends the invalid-action hint and continues (paper Algorithm 1). Never raises on model output.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable

import json_repair
import orjson

TOOL_NAME = "query_agents"

_THINK_END = "</think>"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


@dataclasses.dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclasses.dataclass
class LeadAction:
    thinking: str
    queries: list[str]  # the `query` of each query_agents call (ParSer's scatter)
    answer: str | None
    error: str | None = None
    calls: list[ToolCall] = dataclasses.field(default_factory=list)  # every usable call, in order


def split_thinking(text: str) -> tuple[str, str]:
    """(thinking, rest). The generation prompt opens `<think>`, so text up to `</think>` is thinking."""
    if _THINK_END not in text:
        return "", text
    head, _, rest = text.rpartition(_THINK_END)
    return head.replace("<think>", "", 1).strip(), rest


def _parse_call(body: str, closed: bool) -> tuple[ToolCall | None, str | None]:
    """(call, problem) for one tool-call body in either dialect.

    JSON is repaired leniently only inside a closed `<tool_call>`; a call cut off by the token
    limit must parse as it stands, so a half-written argument is never used.
    """
    function = _XML_FUNCTION.search(body)
    if function:
        params: dict[str, Any] = {k.strip(): v.strip("\n") for k, v in _XML_PARAMETER.findall(function.group(2))}
        return ToolCall(function.group(1).strip(), params), None
    stripped = body.strip()
    if not stripped.startswith("{"):
        return None, "tool call is neither XML nor JSON"
    try:
        call = json_repair.loads(stripped) if closed else orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return None, "truncated tool call"
    if not isinstance(call, dict):
        return None, "tool call JSON is not an object"
    if not isinstance(call.get("name"), str):
        return None, "tool call JSON has no 'name'"
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = json_repair.loads(arguments)
    if not isinstance(arguments, dict):
        return None, "tool call arguments are not an object"
    return ToolCall(call["name"], arguments), None


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[str]]:
    """Every tool call after the thinking (any tool name), and a problem per unusable call."""
    calls, problems = [], []
    for match in _TOOL_CALL.finditer(split_thinking(text)[1]):
        call, problem = _parse_call(match.group(1), closed=match.group(0).endswith("</tool_call>"))
        if call is None:
            problems.append(problem or "unusable tool call")
        else:
            calls.append(call)
    return calls, problems


def _check_query(call: ToolCall) -> str | None:
    query = call.arguments.get("query")
    if "query" not in call.arguments:
        return "tool call without a complete <parameter=query> block"
    if not isinstance(query, str):
        return "tool call has no string 'query' argument"
    if not query.strip():
        return "empty query"
    return None


def parse_lead_output(text: str, tool_names: Iterable[str] | None = (TOOL_NAME,)) -> LeadAction:
    """Answer, or the usable calls to `tool_names` (None: any tool). An answer wins over calls."""
    thinking, action = split_thinking(text)
    answers = _ANSWER.findall(action)
    if answers:
        return LeadAction(thinking, [], answers[-1].strip())
    allowed = None if tool_names is None else set(tool_names)
    found, problems = parse_tool_calls(action)
    calls = []
    for call in found:
        if allowed is not None and call.name not in allowed:
            problems.append(f"unknown tool {call.name!r}")
        elif call.name == TOOL_NAME and (problem := _check_query(call)):
            problems.append(problem)
        else:
            if call.name == TOOL_NAME:
                call.arguments["query"] = call.arguments["query"].strip()
            calls.append(call)
    if calls:
        return LeadAction(thinking, [c.arguments["query"] for c in calls if c.name == TOOL_NAME], None, calls=calls)
    if problems:
        return LeadAction(thinking, [], None, "; ".join(problems))
    if "<answer>" in action:
        return LeadAction(thinking, [], None, "unterminated <answer> block")
    return LeadAction(thinking, [], None, "no tool call and no <answer> block")


# The lead constraint's bounds on a query and an answer, in characters: a constrained call then
# always fits a small turn budget (about 25 tokens of wrapper plus at most ~35 of query).
MAX_QUERY_CHARS = 120
MAX_ANSWER_CHARS = 100


def action_regex(tools: list[dict[str, Any]], dialect: str, thinking: bool = False) -> str:
    """The language "exactly one tool call, or one <answer>, per turn" as a regular expression
    (the lead constraint, `EpisodeConfig.lead_constrained`; for untrained small leads).

    `tools` are the OpenAI-style schemas offered; each must take exactly one string argument
    (`query_agents(query)`). `dialect` is the chat template's call format ("json": Hermes, "xml":
    Qwen3.5's). `thinking`: the generation prompt opened `<think>`, so a thinking block closed by
    `</think>` comes first. Queries and answers are bounded (MAX_QUERY_CHARS, MAX_ANSWER_CHARS).
    Every string this matches parses to one call or one answer here.
    """
    value = f"{{1,{MAX_QUERY_CHARS}}}"  # bounded: a call always fits a small turn budget
    calls = []
    for tool in tools:
        function = tool.get("function", tool)
        params = function.get("parameters", {}).get("properties", {})
        if len(params) != 1 or next(iter(params.values())).get("type") != "string":
            raise ValueError(f"lead constraint: tool {function.get('name')!r} must take exactly one string argument")
        name, arg = re.escape(function["name"]), re.escape(next(iter(params)))
        if dialect == "xml":
            calls.append(f"<tool_call>\\n<function={name}>\\n<parameter={arg}>\\n[^<\\n]{value}\\n</parameter>\\n</function>\\n</tool_call>")
        elif dialect == "json":
            calls.append(f'<tool_call>\\{{"name": "{name}", "arguments": \\{{"{arg}": "[^"\\\\\\n<]{value}"\\}}\\}}</tool_call>')
        else:
            raise ValueError(f"lead constraint: unknown tool-call dialect {dialect!r} (json or xml)")
    head = "([^<]|<[^/])*</think>\\n\\n" if thinking else ""
    answer = f"<answer>[^<\\n]{{1,{MAX_ANSWER_CHARS}}}</answer>"
    return head + "(" + "|".join([*calls, answer]) + ")"
