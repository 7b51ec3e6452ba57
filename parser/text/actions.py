"""Parse one agent generation into thinking, tool calls and/or a final answer.

Every tool-using agent of the project (the ParSer lead, agentic RAG, the DCI agent and the DCI
subagent) runs through `parser.engine.episode.EpisodeEngine`, and this is the one parser it uses.
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
appends the invalid-action hint and continues (paper Algorithm 1). Never raises on model output,
and runs in time linear in its length: tags are found with `str.find` (a regex like
`<parameter=([^>\n]+)>(.*?)</parameter>` rescans the rest of the text from every unclosed
opener, quadratic on repeated tags), and JSON goes through `parser.text.lenient_json`.

`parse_release_turn` applies the authors' turn rules instead (release
train/scripts/parser_agent_loop.py; `parser.engine.protocol` picks one of the two): the whole turn is
searched, thinking included, after trailing `<|im_end|>`/`<|endoftext|>` are stripped; only
closed `<tool_call>` blocks count (strict JSON, else the XML dialect); any call wins over an
answer; a call to another tool, or with a missing/empty/non-string query, stays a call whose
tool reply is an error (`ToolCall.error`), so the turn is still a valid step; an empty `<answer></answer>`, or one that says "No answer
found" (the release's own marker for none), is no answer.

    parse_release_turn(text).queries   # valid non-empty queries, in order
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Iterator, Sequence

from parser.text import release
from parser.text.lenient_json import loads_lenient, loads_strict

TOOL_NAME = "query_agents"

_THINK_END = "</think>"
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)  # linear: an unclosed call ends the text


@dataclasses.dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    error: str | None = None  # release protocol: the tool reply for an unusable call (not executed)


@dataclasses.dataclass
class LeadAction:
    thinking: str
    queries: list[str]  # the `query` of each query_agents call (ParSer's scatter)
    answer: str | None
    error: str | None = None
    calls: list[ToolCall] = dataclasses.field(default_factory=list)  # every usable call, in order


def split_thinking(text: str, opened: bool = False) -> tuple[str, str]:
    """(thinking, rest): text up to the last `</think>` is thinking. Without one, the text is all
    thinking if thinking was open — `opened` (the generation prompt ended with `<think>`) or the
    text starts with `<think>` — and all rest otherwise: a turn cut inside its thinking has no
    action, so an `<answer>` the model was only considering never ends the episode."""
    if _THINK_END not in text:
        if opened or text.lstrip().startswith("<think>"):
            return text.replace("<think>", "", 1).strip(), ""
        return "", text
    head, _, rest = text.rpartition(_THINK_END)
    return head.replace("<think>", "", 1).strip(), rest


def _answers(text: str) -> list[str]:
    """Bodies of `<answer>…</answer>`, as `re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)`."""
    found, pos = [], 0
    while (start := text.find("<answer>", pos)) >= 0:
        end = text.find("</answer>", start + 8)
        if end < 0:
            break  # no later opener can close either
        found.append(text[start + 8 : end])
        pos = end + 9
    return found


def _named_blocks(text: str, tag: str, *, need_close: bool) -> Iterator[tuple[str, str]]:
    r"""(name, body) of each `<tag=name>body</tag>` in order, as the regex
    `<tag=([^>\n]+)>(.*?)</tag>` (or `(?:</tag>|\Z)` without `need_close`) finds them."""
    opener, closer = f"<{tag}=", f"</{tag}>"
    pos, gt = 0, -1
    while (start := text.find(opener, pos)) >= 0:
        name_start = start + len(opener)
        if gt < name_start:  # the first '>' after name_start; reused while still ahead (no rescans)
            gt = text.find(">", name_start)
            if gt < 0:
                return
        newline = text.find("\n", name_start, gt)
        if newline >= 0:  # a name never spans a line, and no opener before this newline can close
            pos = newline + 1
            continue
        if gt == name_start:  # empty name
            pos = name_start
            continue
        end = text.find(closer, gt + 1)
        if end < 0:
            if not need_close:
                yield text[name_start:gt], text[gt + 1 :]
            return
        yield text[name_start:gt], text[gt + 1 : end]
        pos = end + len(closer)


def _parse_call(body: str, closed: bool) -> tuple[ToolCall | None, str | None]:
    """(call, problem) for one tool-call body in either dialect.

    JSON is repaired leniently only inside a closed `<tool_call>`; a call cut off by the token
    limit must parse as it stands, so a half-written argument is never used.
    """
    function = next(_named_blocks(body, "function", need_close=False), None)
    if function:
        params: dict[str, Any] = {k.strip(): v.strip("\n") for k, v in _named_blocks(function[1], "parameter", need_close=True)}
        return ToolCall(function[0].strip(), params), None
    stripped = body.strip()
    if not stripped.startswith("{"):
        return None, "tool call is neither XML nor JSON"
    call, problem = loads_lenient(stripped) if closed else loads_strict(stripped)
    if problem:
        return None, f"tool call JSON {problem}" if closed or problem.startswith("nested") else "truncated tool call"
    if not isinstance(call, dict):
        return None, "tool call JSON is not an object"
    if not isinstance(call.get("name"), str):
        return None, "tool call JSON has no 'name'"
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        arguments, problem = loads_lenient(arguments)
        if problem:
            return None, f"tool call arguments are {problem}"
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


def parse_lead_output(text: str, tool_names: Iterable[str] | None = (TOOL_NAME,), thinking_open: bool = False) -> LeadAction:
    """Answer, or the usable calls to `tool_names` (None: any tool). An answer wins over calls.
    `thinking_open`: the generation prompt opened `<think>` (`split_thinking`)."""
    thinking, action = split_thinking(text, opened=thinking_open)
    if not action.strip() and _THINK_END not in text and (thinking_open or text.lstrip().startswith("<think>")):
        return LeadAction(thinking, [], None, "thinking not finished (no </think>): nothing after it to act on")
    answers = _answers(action)
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


# --- the release's turn rules ---
_RELEASE_FUNCTION = re.compile(r"<function\s*=\s*([^>\n]+)>\s*(.*?)\s*</function>", re.DOTALL)
_RELEASE_PARAMETER = re.compile(r"<parameter\s*=\s*([^>\n]+)>\s*(.*?)\s*</parameter>", re.DOTALL)


def _release_arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    if arguments is None:
        return {}
    if isinstance(arguments, str) and arguments.strip().startswith(("{", "[")):
        parsed, problem = loads_strict(arguments.strip())
        if problem is not None:
            return {"_raw": arguments}
        return parsed if isinstance(parsed, dict) else {"_raw": parsed}
    return {"_raw": arguments}


def _release_json_calls(spec: Any) -> list[ToolCall]:
    if isinstance(spec, list):
        return [call for item in spec for call in _release_json_calls(item)]
    if not isinstance(spec, dict):
        return []
    function = spec["function"] if isinstance(spec.get("function"), dict) else spec
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        return []
    return [ToolCall(name.strip(), _release_arguments(function.get("arguments", {})))]


def _release_value(raw: str) -> Any:
    value = raw.strip()
    if value.startswith(("{", "[")) or (value.startswith('"') and value.endswith('"') and value):
        parsed, problem = loads_strict(value)
        return value if problem is not None else parsed
    return value


def _release_block(payload: str) -> list[ToolCall]:
    """The calls in one closed `<tool_call>` block: strict JSON first, else the XML dialect
    (after literal backslash escapes the model sometimes writes are unescaped)."""
    payload = payload.strip()
    if payload.startswith(("{", "[")):
        parsed, problem = loads_strict(payload)  # depth-capped: nested brackets never raise
        calls = _release_json_calls(parsed) if problem is None else []
        if calls:
            return calls
    payload = payload.replace("\\r\\n", "\n").replace("\\n", "\n").replace("\\t", "\t").strip()
    calls = []
    for function in _RELEASE_FUNCTION.finditer(payload):
        name = function.group(1).strip()
        if name:
            params = {k.strip(): _release_value(v) for k, v in _RELEASE_PARAMETER.findall(function.group(2)) if k.strip()}
            calls.append(ToolCall(name, params))
    return calls


def _release_calls(text: str) -> list[ToolCall]:
    calls, position = [], 0
    while (start := text.find("<tool_call>", position)) >= 0:
        end = text.find("</tool_call>", start)
        if end < 0:
            break
        calls += _release_block(text[start + len("<tool_call>"): end])
        position = end + len("</tool_call>")
    return calls


def _release_check(call: ToolCall) -> ToolCall:
    if call.name != TOOL_NAME:
        call.error = release.unknown_tool_error(call.name)
        return call
    query = call.arguments.get("query") or ""
    if not isinstance(query, str):
        call.error = release.query_type_error(query)
    elif not query.strip():
        call.error = release.MISSING_QUERY_ERROR
    else:
        call.arguments["query"] = query.strip()
    return call


def parse_release_turn(text: str) -> LeadAction:
    """One lead turn under the release's rules (module docstring); its only tool is query_agents."""
    text = release.strip_trailing_markers(text)
    thinking = split_thinking(text)[0]
    calls = [_release_check(call) for call in _release_calls(text)]
    if calls:
        return LeadAction(thinking, [c.arguments["query"] for c in calls if c.error is None], None, calls=calls)
    answer = release.extract_answer(text)
    if answer is not None:
        return LeadAction(thinking, [], answer)
    return LeadAction(thinking, [], None, "no tool call and no non-empty <answer> block")

# The lead constraint's bounds on a query and an answer, in characters: a constrained call then
# fits a 128-token turn even when a degenerate small model spends one token per character
# (about 25 tokens of wrapper plus at most 80 of query; ~20 for a real question).
MAX_QUERY_CHARS = 80
MAX_ANSWER_CHARS = 80
STRIPPED = " \t\r\f\v"  # what the parser strips from a query's ends (newlines are never in one)
# Characters no question needs and a small model's tool-call debris is made of: a constrained
# query may not contain them (SmolLM2 wrote `Reketh Hefeirk}}}22 of 14 agents` into a query).
QUERY_DEBRIS = "{}[]<>|\\"


def action_regex(tools: list[dict[str, Any]], dialect: str, thinking: bool = False, exclude: Sequence[str] = (),
                 answer: bool = True, call: bool = True) -> str:
    """The language "exactly one tool call, or one <answer>, per turn" as a regular expression
    (the lead constraint, `EpisodeConfig.constrain_lead`; for untrained small leads).

    `tools` are the OpenAI-style schemas offered; each must take exactly one string argument
    (`query_agents(query)`). `dialect` is the chat template's call format ("json": Hermes, "xml":
    Qwen3.5's). `thinking`: the generation prompt opened `<think>`, so a thinking block closed by
    `</think>` comes first. Queries and answers are bounded (MAX_QUERY_CHARS, MAX_ANSWER_CHARS).
    `exclude`: queries the call may not repeat verbatim (`EpisodeConfig.distinct_queries`).
    `answer=False`: a call only (`EpisodeConfig.query_first`, before the lead's first query).
    `call=False`: an answer only (`EpisodeConfig.answer_last_turn`, the episode's last turn).
    A query holds none of QUERY_DEBRIS.
    Every string this matches parses to one call or one answer here.
    """
    calls = []
    for opener, closer, tail in _call_frames(tools, dialect):
        value = string_except(exclude, closer + "\n" + QUERY_DEBRIS, MAX_QUERY_CHARS)  # no line breaks either
        calls.append(_escaped(opener) + value + _escaped(closer + tail))
    head = "([^<]|<[^/])*" + _escaped(_THINK_END + "\n\n") if thinking else ""
    calls = calls if call else []
    if not calls and not answer:
        raise ValueError("lead constraint: no tools offered and no answer allowed: nothing could be generated")
    answers = [f"<answer>[^<\\n]{{1,{MAX_ANSWER_CHARS}}}</answer>"] if answer else []
    return head + "(" + "|".join([*calls, *answers]) + ")"


@dataclasses.dataclass(frozen=True)
class QueryExclusion:
    """The exclusion of `action_regex` kept apart from the rest of the constraint, for a backend
    that masks tokens itself (`parser.serving.backends.grammar`). Compiling a grammar costs
    0.7-6.7 s with a 151K-token vocabulary, and under `distinct_queries` the full regex is new
    every turn; `base` (the same constraint, nothing excluded) is one of a few per episode, so it
    is compiled once and the exclusion is applied while matching.

    The rule that makes base + rule accept exactly the full regex's language: a query that equals
    one of `queries` may not be closed (its `closer` may not follow), and, since the full regex
    never enters a query it could neither close nor extend, none may reach one of `max_chars`
    characters. The query starts after `body_after`'s first occurrence ("" : at the start) and
    one of `openers` (one per tool), and ends at the `closer`, a character no query holds."""

    base: str
    queries: tuple[str, ...]
    openers: tuple[str, ...]
    closer: str
    body_after: str
    max_chars: int


def action_constraint(tools: list[dict[str, Any]], dialect: str, thinking: bool = False, exclude: Sequence[str] = (),
                      answer: bool = True, call: bool = True) -> tuple[str, QueryExclusion | None]:
    """`action_regex` with these arguments, and its exclusion apart (None when nothing is
    excluded): a server compiles the regex, an in-process matcher the exclusion's `base`."""
    regex = action_regex(tools, dialect, thinking, exclude, answer, call)
    if not exclude or not call:
        return regex, None
    frames = _call_frames(tools, dialect)
    return regex, QueryExclusion(base=action_regex(tools, dialect, thinking, (), answer, call),
                                 queries=tuple(dict.fromkeys(exclude)), openers=tuple(f[0] for f in frames),
                                 closer=frames[0][1], body_after=_THINK_END + "\n\n" if thinking else "",
                                 max_chars=MAX_QUERY_CHARS)


def _call_frames(tools: list[dict[str, Any]], dialect: str) -> list[tuple[str, str, str]]:
    """Per tool, the literal text of its call around the query: what comes before the query, the
    character that ends it (never in a query), and what follows that character."""
    frames = []
    for tool in tools:
        function = tool.get("function", tool)
        params = function.get("parameters", {}).get("properties", {})
        if len(params) != 1 or next(iter(params.values())).get("type") != "string":
            raise ValueError(f"lead constraint: tool {function.get('name')!r} must take exactly one string argument")
        name, arg = function["name"], next(iter(params))
        if dialect == "xml":
            frames.append((f"<tool_call>\n<function={name}>\n<parameter={arg}>\n", "\n",
                           "</parameter>\n</function>\n</tool_call>"))
        elif dialect == "json":
            frames.append((f'<tool_call>{{"name": "{name}", "arguments": {{"{arg}": "', '"', "}}</tool_call>"))
        else:
            raise ValueError(f"lead constraint: unknown tool-call dialect {dialect!r} (json or xml)")
    return frames


def string_except(forbidden: Sequence[str], excluded: str, max_len: int, strip: str = STRIPPED) -> str:
    """A regular expression for the strings of 1..`max_len` characters not in `excluded`, that
    neither start nor end with a `strip` character (the parser strips them, so a padded repeat
    would still be a repeat), none of them equal to a string of `forbidden`.

    A trie of the forbidden strings: at each node a string may stop (unless the node ends a
    forbidden string, or its last character is one `strip` names), follow a child, or leave the
    trie with any other character and continue freely. Linear in the forbidden strings' length."""
    inner, edge = _negated(excluded), _negated(excluded + strip)
    trie: dict[str | None, Any] = {}
    for text in forbidden:
        if text and len(text) <= max_len and not set(text) & set(excluded) and text == text.strip(strip):
            node = trie
            for char in text:
                node = node.setdefault(char, {})
            node[None] = {}  # a forbidden string ends here

    def tail(left: int, required: bool) -> str:
        """1..`left` more characters ending on an edge character (or none, if not required)."""
        if left <= 0:
            return ""
        body = (f"{inner}{{0,{left - 1}}}" if left > 1 else "") + edge
        return body if required else f"({body})?"

    def at(node: dict[str | None, Any], depth: int, last: str | None) -> str | None:
        """The rest of a string at this trie node; None where no string can go on from it."""
        children = sorted(c for c in node if c is not None)
        branches = [_literal(c) + rest for c in children if (rest := at(node[c], depth + 1, c)) is not None]
        left = max_len - depth - 1
        if depth < max_len:
            branches.append(_negated(excluded + strip + "".join(children)) + tail(left, required=False))
            inside = [c for c in strip if c not in children]
            if depth > 0 and left > 0 and inside:  # a space inside the string, then more of it
                branches.append("[" + "".join(map(_class_char, inside)) + "]" + tail(left, required=True))
        may_stop = depth > 0 and None not in node and last not in strip
        if not branches:
            return "" if may_stop else None
        group = "(" + "|".join(branches) + ")"
        return group + "?" if may_stop else group

    return at(trie, 0, None)


def _literal(char: str) -> str:
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char, "\\" + char if char in "\\.^$*+?()[]{}|/-" else char)


def _escaped(text: str) -> str:
    """`text` as a regex that matches it literally (in the syntax of Python's and xgrammar's)."""
    return "".join({"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(c, "\\" + c if c in "\\.^$*+?()[]{}|" else c)
                   for c in text)


def _class_char(char: str) -> str:
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\f": "\\f", "\v": "\\v"}.get(
        char, "\\" + char if char in "\\]^-[" else char)


def _negated(chars: str) -> str:
    """A character class of everything but `chars`."""
    return "[^" + "".join(_class_char(c) for c in sorted(set(chars))) + "]"
