"""The lead's structured update: its JSON schema (schema.json beside this file), its prompts, and
the lenient reading of what the lead wrote into one typed `Update`.

The schema constrains decoding where the backend can (`SamplingParams.json_schema`: SGLang,
vLLM, the in-process xgrammar masks); with `constrain: false`, or a reply cut at its token limit,
the same reader takes what it can (`parser.text.lenient_json`) and drops malformed entries one by one,
counting them, so one bad field never loses the rest of the turn. The schema's bounds govern
every update, decoded under it or not: a string past its `maxLength` is cut there and a list
past its `maxItems` loses its tail, each said in the problems (`within_schema`). So no update
can grow a conclusion, the question's own C1 included, past what the state budget was sized for.

    schema = update_schema(max_queries=2)     # schema.json with the turn's query bound
    schema = update_schema(2, ["C1", "C2"], ["C1"], ["E1"])   # ... and the ids of this turn's state
    update, problems = read_update(text)      # problems: what was dropped, and why
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

from parser.text.actions import split_thinking
from parser.text.lenient_json import loads_lenient

HERE = Path(__file__).resolve().parent
PROMPT_VERSION = "v1"  # prompts/v1/: a change that alters behaviour is a new folder
PROMPT_FIELDS = {"system": {"acquisition"}, "user": {"question", "state"}, "acquire_readers": set(),
                 "acquire_corpus": {"commands"}}


@functools.lru_cache(maxsize=None)
def _template(name: str) -> str:
    if name not in PROMPT_FIELDS:
        raise KeyError(f"unknown longharness prompt {name!r}; known: {sorted(PROMPT_FIELDS)}")
    return (HERE / "prompts" / PROMPT_VERSION / f"{name}.txt").read_text(encoding="utf-8").rstrip("\n")


def render_prompt(name: str, **fields: str) -> str:
    """prompts/<name>.txt with its `{field}`s filled (plain replacement: the system prompt shows
    JSON, whose braces `str.format` would read as fields)."""
    missing = PROMPT_FIELDS[name] - fields.keys() if name in PROMPT_FIELDS else set()
    text = _template(name)
    if missing:
        raise KeyError(f"longharness prompt {name!r} needs field(s) {sorted(missing)}")
    for key, value in fields.items():
        text = text.replace("{" + key + "}", value)
    return text


@functools.lru_cache(maxsize=None)
def _schema() -> dict[str, Any]:
    return json.loads((HERE / "schema.json").read_text(encoding="utf-8"))


def update_schema(max_queries: int, conclusions: list[str] | None = None, open_ids: list[str] | None = None,
                  evidence: list[str] | None = None, fresh: int = 2) -> dict[str, Any]:
    """The update's JSON schema, at most `max_queries` queries a turn. Given the state's ids, every
    id field is narrowed to what exists this turn (plus `fresh` new conclusion ids, which a
    query of the same update may serve): a query can only name an open conclusion, a citation
    only a current evidence id (with none, no citation or retirement can be written)."""
    schema = copy.deepcopy(_schema())
    props = schema["properties"]
    props["queries"]["maxItems"] = max_queries
    if conclusions is None:
        return schema
    new = [f"C{len(conclusions) + i}" for i in range(1, fresh + 1)]
    item, query, retire = props["conclusions"]["items"]["properties"], props["queries"]["items"]["properties"], props["retire"]
    item["id"] = {"enum": list(conclusions) + new}
    query["conclusion"] = {"enum": list(open_ids or []) + new}
    ids = list(evidence or [])
    for array in (item["evidence"], props["answer"]["properties"]["evidence"]):
        array["items"] = {"enum": ids} if ids else {"type": "string", "maxLength": 4}
        if not ids:
            array["maxItems"] = 0
    if not ids:  # with no current evidence, no conclusion can be anything but open
        item["status"] = {"enum": ["open"]}
    if ids:
        retire["items"]["properties"]["evidence"] = {"enum": ids}
        retire["items"]["properties"]["by"] = {"enum": ["", *ids]}
    else:
        retire["maxItems"] = 0
    return schema


def within_schema(value: Any, schema: dict[str, Any], where: str, problems: list[str]) -> Any:
    """`value` cut to the schema's `maxLength` and `maxItems`, through `properties` and `items`;
    each cut is named in `problems`. Types are not checked here (`read_update` drops bad entries)."""
    if isinstance(value, str) and "maxLength" in schema and len(value) > schema["maxLength"]:
        problems.append(f"{where} cut to {schema['maxLength']} characters (from {len(value)})")
        return value[: schema["maxLength"]]
    if isinstance(value, list):
        most = schema.get("maxItems")
        if most is not None and len(value) > most:
            problems.append(f"{where}: {len(value) - most} entries past the schema's {most} dropped")
            value = value[:most]
        items = schema.get("items") or {}
        return [within_schema(v, items, f"{where}[{i}]", problems) for i, v in enumerate(value)]
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        return {k: within_schema(v, props[k], f"{where}.{k}" if where else k, problems) if k in props else v
                for k, v in value.items()}
    return value


@dataclasses.dataclass
class Update:
    conclusions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    retire: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    queries: list[dict[str, str]] = dataclasses.field(default_factory=list)
    answer: str = ""
    answer_evidence: list[str] = dataclasses.field(default_factory=list)


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) else None


def _ids(value: Any) -> list[str]:
    return [v.strip() for v in value if isinstance(v, str) and v.strip()] if isinstance(value, list) else []


def _entries(value: dict[str, Any], key: str, problems: list[str]) -> list[Any]:
    entries = value.get(key)
    if entries is None or isinstance(entries, list):
        return entries or []
    problems.append(f"{key} dropped: not a list")
    return []


def read_update(text: str, thinking_open: bool = False, constrained: bool = False,
                max_queries: int | None = None) -> tuple[Update | None, list[str]]:
    """(the update, problems). None when no JSON object can be read at all (an invalid turn).
    `constrained`: decoded under the schema, the whole reply is the update (a `</think>` inside
    one of its strings is text, not the end of a thinking block). `max_queries`: the turn's query
    bound (else schema.json's); every other bound is schema.json's."""
    body = text if constrained else split_thinking(text, opened=thinking_open)[1]
    start = body.find("{")
    if start < 0:
        return None, ["no JSON object in the reply"]
    value, problem = loads_lenient(body[start:])
    if isinstance(value, list):
        value = next((v for v in value if isinstance(v, dict)), None)
    if not isinstance(value, dict):
        return None, [f"the reply is not a JSON object ({problem or type(value).__name__})"]
    update, problems = Update(), [problem] if problem else []
    schema = update_schema(max_queries) if max_queries is not None else _schema()
    if isinstance(value.get("answer"), str):  # the bare-string form of {"text": ...}
        value = {**value, "answer": {"text": value["answer"], "evidence": []}}
    value = within_schema(value, schema, "", problems)
    for entry in _entries(value, "conclusions", problems):
        statement = _text(entry.get("statement")) if isinstance(entry, dict) else None
        if statement is None:
            problems.append(f"conclusion dropped: {str(entry)[:80]}")
            continue
        update.conclusions.append({"id": _text(entry.get("id")) or "", "statement": statement,
                                   "status": _text(entry.get("status")) or "open",
                                   "evidence": _ids(entry.get("evidence")), "needs": _text(entry.get("needs")) or ""})
    for entry in _entries(value, "retire", problems):
        if not isinstance(entry, dict) or not _text(entry.get("evidence")):
            problems.append(f"retirement dropped: {str(entry)[:80]}")
            continue
        update.retire.append({"evidence": _text(entry["evidence"]), "status": _text(entry.get("status")) or "",
                              "by": _text(entry.get("by")) or None, "reason": _text(entry.get("reason")) or ""})
    for entry in _entries(value, "queries", problems):
        query = _text(entry.get("query")) if isinstance(entry, dict) else None
        if not query:
            problems.append(f"query dropped: {str(entry)[:80]}")
            continue
        update.queries.append({"conclusion": _text(entry.get("conclusion")) or "", "query": query})
    answer = value.get("answer")
    if isinstance(answer, dict):
        update.answer, update.answer_evidence = _text(answer.get("text")) or "", _ids(answer.get("evidence"))
    return update, problems
