"""JSON from model text, in bounded time and without raising: strict first, json-repair only when cheap.

A model writes the tool calls and subagent replies these functions read, so the text may be
built to hurt: hundreds of nested brackets (the C parsers raise `RecursionError`, json-repair
`RecursionError`/`ValueError`), or garbage on which json-repair is slow — it costs about 5 µs
per character *per open bracket* (measured: 64 `{` then 8 KB of quotes takes 3 s). So:

* strict parsing (`json`'s C scanner: linear, tolerant of `NaN`/`Infinity` as before) comes first;
* a value cut off before its end (a reply at its token limit, the common case) is closed in one
  linear pass as json-repair would close it (`complete_truncated`), whatever its length or
  brackets;
* json-repair runs only when `len(text) * (1 + open brackets) <= REPAIR_BUDGET` (~0.2 s worst);
* a value nested deeper than `MAX_DEPTH` is refused (no tool call or finding needs it, and
  later serialisation — `orjson.dumps` stops at 254 levels, `repr` recurses — would fail);
* an escaped surrogate pair that json-repair leaves as two code points (`"\\ud83d\\ude00"` in a
  cut-off reply) is joined into its character; lone surrogates (`"\\ud800"`) become U+FFFD, so
  the strings can be encoded later.

Every function returns `(value, problem)`: `problem` is None on success, else a short reason.

    value, problem = loads_lenient('{"name": "bash", "arguments": {"command": "ls",}}')
"""
from __future__ import annotations

import json
import re
from typing import Any

import json_repair

REPAIR_BUDGET = 32_768  # characters x (1 + open brackets) json-repair may be given
COMPLETE_BUDGET = 131_072  # characters of a cut-off value that is closed (~0.15 s worst; a 2,048-token turn is ~8,000)
MAX_DEPTH = 32  # deepest list/dict nesting accepted in a parsed value
_OPENERS = "{[("  # json-repair also reads parenthesised tuples
_DECODER = json.JSONDecoder()
_SURROGATE = re.compile("[\ud800-\udfff]")
_OUTSIDE = re.compile(r'["{}\[\]:,]')  # what changes the structure outside a string
_INSIDE = re.compile(r'["\\]')  # what ends or escapes inside one


def _clean(value: Any) -> tuple[Any, str | None]:
    """`value` with lone surrogates replaced, or a problem if it nests deeper than MAX_DEPTH."""
    if isinstance(value, str):
        return _clean_str(value), None
    if not isinstance(value, (dict, list)):
        return value, None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:  # iterative: the value may be up to ~1000 levels deep (the C scanner's own limit)
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return None, f"nested deeper than {MAX_DEPTH} levels"
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in list(items):
            if isinstance(child, str):
                node[key] = _clean_str(child)
            elif isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
            if isinstance(key, str) and (clean := _clean_str(key)) != key:
                node[clean] = node.pop(key)
    return value, None


def _clean_str(text: str) -> str:
    """Surrogate pairs joined into their character, lone surrogates replaced (linear)."""
    if text.isascii() or not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def loads_strict(text: str) -> tuple[Any, str | None]:
    """One complete JSON value (surrounding whitespace allowed), nothing repaired."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None, "not valid JSON"
    return _clean(value)


def complete_truncated(text: str) -> str | None:
    """The JSON object or array starting at `text`'s first bracket, cut off before its end, closed
    as json-repair closes it: an open string is closed (an escape cut in half stays literal text),
    a key without its value is dropped (json-repair turns an object whose first key is cut into a
    list of that key), `"key":` gets `""`, a trailing comma goes, then every open bracket is closed. None when `text` is no such prefix: its value ends, or a bracket mismatches.
    One pass, linear in `len(text)`; the result still has to parse (a cut `tru` does not)."""
    if len(text) > COMPLETE_BUDGET:
        return None
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        return None
    start = min(starts)
    closers: list[str] = []  # per open container: its closing bracket
    opens: list[int] = []  # ... where it opened
    expect: list[str] = []  # ... what comes next: "key" | "colon" | "value" | "comma"
    position, string_start, key_start, key_end, cut_escape = start, -1, -1, -1, -1
    while cut_escape < 0:
        found = _OUTSIDE.search(text, position)
        if found is None:
            break
        at, char = found.start(), found.group()
        if char == '"':
            string_start = at
            position = at + 1
            while (inside := _INSIDE.search(text, position)) is not None and inside.group() == "\\":
                width = 6 if text.startswith("u", inside.start() + 1) else 2
                if inside.start() + width > len(text):
                    cut_escape = inside.start()
                    break
                position = inside.start() + width
            if cut_escape >= 0 or inside is None:
                break  # the text ends inside this string
            position = inside.end()
            if closers[-1] == "}" and expect[-1] == "key":
                expect[-1], key_start, key_end = "colon", string_start, position
            else:
                expect[-1] = "comma"
            string_start = -1
            continue
        position = at + 1
        if char in "{[":
            if closers:
                expect[-1] = "comma"
            closers.append("}" if char == "{" else "]")
            opens.append(at)
            expect.append("key" if char == "{" else "value")
        elif char in "}]":
            if not closers or closers.pop() != char:
                return None
            opens.pop()
            expect.pop()
            if not closers:
                return None  # the value is complete: not a truncation
        elif char == ":" and closers[-1] == "}":
            expect[-1] = "value"
        elif char == ",":
            expect[-1] = "key" if closers[-1] == "}" else "value"
    in_object = closers[-1] == "}"
    if in_object and (expect[-1] == "colon" or (string_start >= 0 and expect[-1] == "key")):  # a key, cut
        key = key_start if expect[-1] == "colon" else string_start
        inside = text[key + 1: key_end - 1] if expect[-1] == "colon" else _literal_cut(text, key + 1, cut_escape)
        if text[opens[-1] + 1: key].strip() or not inside:
            body = text[start:key].rstrip()
        else:  # the object's first key: json-repair reads `{"ke` as ["ke"]
            body, closers[-1] = text[start:opens[-1]] + "[" + f'"{inside}"', "]"
    elif string_start >= 0:  # cut inside a value
        inside = _literal_cut(text, string_start + 1, cut_escape) if cut_escape >= 0 else _cut_string_end(
            text[string_start + 1:], in_object)
        body = text[start:string_start + 1] + inside + '"' if inside or in_object else text[start:string_start].rstrip()
    else:
        body = text[start:].rstrip()
        if in_object and expect[-1] == "value" and body.endswith(":"):
            body += ' ""'
    return body.removesuffix(",") + "".join(reversed(closers))


def _literal_cut(text: str, begin: int, cut_escape: int) -> str:
    """A cut string's inside from `begin`; an escape cut in half (`\\u00`) becomes literal text."""
    return text[begin:] if cut_escape < 0 else text[begin:cut_escape] + "\\\\" + text[cut_escape + 1:]


def _cut_string_end(raw: str, in_object: bool) -> str:
    """The inside of a string cut off by the end of the text, ended as json-repair ends it: its
    trailing whitespace goes, escaped (`\\n`) or not; in an object, first a `}` the string did
    not open and then a trailing comma that is its only one go too (json-repair reads them as
    the object's end)."""
    if in_object:
        raw = raw.rstrip()
        if raw.endswith("}") and "{" not in raw:
            raw = raw[:-1].rstrip()
        if raw.endswith(",") and raw.count(",") == 1:
            raw = raw[:-1]
    end = len(raw)
    while end:
        if raw[end - 1].isspace():
            end -= 1
        elif end >= 2 and raw[end - 1] in "ntr" and raw[end - 2] == "\\" and _escaped(raw, end - 2):
            end -= 2
        else:
            break
    return raw[:end]


def _escaped(raw: str, backslash: int) -> bool:
    """True if the backslash at `backslash` starts an escape (an even run of backslashes before it)."""
    before = backslash
    while before and raw[before - 1] == "\\":
        before -= 1
    return (backslash - before) % 2 == 0


def loads_lenient(text: str) -> tuple[Any, str | None]:
    """Strict JSON, else the closing of a cut-off value, else json-repair's reading of it when that
    is cheap enough (see module doc)."""
    value, problem = loads_strict(text)
    if problem is None or problem.startswith("nested"):
        return value, problem
    completed = complete_truncated(text)
    if completed is not None:
        value, completed_problem = loads_strict(completed)
        if completed_problem is None or completed_problem.startswith("nested"):
            return value, completed_problem
    openers = sum(text.count(c) for c in _OPENERS)
    if len(text) * (1 + openers) > REPAIR_BUDGET:
        return None, f"too long or too bracketed to repair ({len(text)} characters, {openers} open brackets)"
    try:
        value = json_repair.loads(text)
    except Exception:  # noqa: BLE001 - third-party code on hostile text: any failure means "not JSON"
        return None, "not repairable JSON"
    return _clean(value)


def loads_leading(text: str) -> tuple[Any, str | None]:
    """The JSON value `text` starts with, ignoring what follows it (a reply that keeps talking).

    The strict scanner finds the value's end in linear time; only if that fails is a bounded
    prefix handed to json-repair.
    """
    try:
        value, _ = _DECODER.raw_decode(text)
    except (ValueError, RecursionError):
        prefix = text[:REPAIR_BUDGET]
        openers = sum(prefix.count(c) for c in _OPENERS)
        return loads_lenient(prefix[: REPAIR_BUDGET // (1 + openers)])
    return _clean(value)
