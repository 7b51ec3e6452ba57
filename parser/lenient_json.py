"""JSON from model text, in bounded time and without raising: strict first, json-repair only when cheap.

A model writes the tool calls and subagent replies these functions read, so the text may be
built to hurt: hundreds of nested brackets (the C parsers raise `RecursionError`, json-repair
`RecursionError`/`ValueError`), or garbage on which json-repair is slow — it costs about 5 µs
per character *per open bracket* (measured: 64 `{` then 8 KB of quotes takes 3 s). So:

* strict parsing (`json`'s C scanner: linear, tolerant of `NaN`/`Infinity` as before) comes first;
* json-repair runs only when `len(text) * (1 + open brackets) <= REPAIR_BUDGET` (~0.2 s worst);
* a value nested deeper than `MAX_DEPTH` is refused (no tool call or finding needs it, and
  later serialisation — `orjson.dumps` stops at 254 levels, `repr` recurses — would fail);
* lone surrogates (`"\\ud800"` escapes) become U+FFFD, so the strings can be encoded later.

Every function returns `(value, problem)`: `problem` is None on success, else a short reason.

    value, problem = loads_lenient('{"name": "bash", "arguments": {"command": "ls",}}')
"""
from __future__ import annotations

import json
import re
from typing import Any

import json_repair

REPAIR_BUDGET = 32_768  # characters x (1 + open brackets) json-repair may be given
MAX_DEPTH = 32  # deepest list/dict nesting accepted in a parsed value
_OPENERS = "{[("  # json-repair also reads parenthesised tuples
_DECODER = json.JSONDecoder()
_SURROGATE = re.compile("[\ud800-\udfff]")  # json joins escaped pairs, so any left is a lone one


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
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def loads_strict(text: str) -> tuple[Any, str | None]:
    """One complete JSON value (surrounding whitespace allowed), nothing repaired."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None, "not valid JSON"
    return _clean(value)


def loads_lenient(text: str) -> tuple[Any, str | None]:
    """Strict JSON, else json-repair's reading of it when that is cheap enough (see module doc)."""
    value, problem = loads_strict(text)
    if problem is None or problem.startswith("nested"):
        return value, problem
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
