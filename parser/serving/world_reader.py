"""A rule-based reader of the synthetic world's prose: the frozen subagent of the CPU learning run.

Why it exists: a CPU learning run needs readers that *hold the facts* — a subagent that answers
a query from its chunk when the chunk can answer it, and abstains otherwise — without a model
that costs seconds per reply. `data_prep.synthetic_world` writes every fact in a fixed sentence
shape ("X is a 1945 ... directed by Y.", "She was born in Z, ..."); this reader inverts those
shapes. It stands in for SGLang subagents behind the gateway and is served over HTTP by the
loopback worker (`parser loopback --reader world`), so the lead's scatter,
gather and observations are the real ones.

What it reads: the paragraphs of its own excerpt only (`Document i:` / title / text, as
`parser.text.chunking` packs them). A paragraph answers when its *title* is named in the query and a
relation the query asks for ("directed", "born", "father", "produced", "headquartered",
"founded") has its sentence in that paragraph; the reply is the finding JSON the subagent prompt
asks for, with that sentence as evidence. A whole two-hop question names one entity (the film,
the person), so it gets that entity's fact — the first hop — never the final answer.

`QUERY_TEMPLATES` are how a lead asks for each relation (the demonstrations of
`parser train warm-start` use them); the reader accepts any wording with the keyword.

    >>> read("Document 1:\\nZorvan\\nZorvan is a 1981 film directed by Miro Tal. ", "Who directed Zorvan?")
    {'evidence': 'Zorvan is a 1981 film directed by Miro Tal.', 'answer': 'Miro Tal'}
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

_PARAGRAPH = re.compile(r"Document \d+:\n([^\n]+)\n([^\n]*)")
_EXCERPT = re.compile(r"<excerpt>\n(.*)\n</excerpt>", re.S)
_QUERY = re.compile(r"Query:[ \t]*(.*?)[ \t]*(?:<\|im_end\|>|\n|$)")


@dataclasses.dataclass(frozen=True)
class Relation:
    keywords: tuple[str, ...]  # any of these (lower case) in the query asks for this relation
    pattern: re.Pattern  # group 1 = the answer, inside the sentence that states it


# The synthetic world's relation names (its `evidences` triples) -> how to find them in its prose.
RELATIONS: dict[str, Relation] = {
    "director": Relation(("direct",), re.compile(r"directed by ([^.]+?)\.")),
    "place of birth": Relation(("born", "birth"), re.compile(r"was born in ([^,.]+),")),
    "father": Relation(("father",), re.compile(r"was the (?:son|daughter) of ([^.]+?)\.")),
    "producer": Relation(("produc",), re.compile(r"produced by (.+?) and premiered")),
    "headquarters location": Relation(("headquarter",), re.compile(r"Its headquarters are in ([^.]+?)\.")),
    "inception": Relation(("founded", "inception"), re.compile(r"organisation founded in (\d+) by")),
}

QUERY_TEMPLATES: dict[str, str] = {
    "director": "Who directed {}?",
    "place of birth": "Where was {} born?",
    "father": "Who is the father of {}?",
    "producer": "Which organisation produced {}?",
    "headquarters location": "Where is {} headquartered?",
    "inception": "When was {} founded?",
}

ABSTENTION = {"answer": "unknown"}


def _sentence(text: str, start: int, end: int) -> str:
    """The sentence of `text` around [start, end): from after the previous '. ' to its own '.'."""
    left = text.rfind(". ", 0, start)
    right = text.find(". ", end - 1)
    return text[left + 2 if left >= 0 else 0: right + 1 if right >= 0 else len(text)].strip()


def _named(title: str, query: str) -> bool:
    """`title` occurs in `query` as a whole name (not inside a longer word)."""
    for m in re.finditer(re.escape(title), query):
        before = query[m.start() - 1] if m.start() else " "
        after = query[m.end()] if m.end() < len(query) else " "
        if not before.isalnum() and not (after.isalnum() or after == "("):
            return True
    return False


def read(excerpt: str, query: str) -> dict[str, str] | None:
    """The finding for `query` from `excerpt`, or None when the excerpt cannot answer it."""
    asked = [r for r in RELATIONS.values() if any(k in query.lower() for k in r.keywords)]
    if not asked:
        return None
    paragraphs = [(m.group(1).strip(), m.group(2)) for m in _PARAGRAPH.finditer(excerpt)]
    named = [(title, text) for title, text in paragraphs if _named(title, query)]
    # "The Glass Ferry (2)" named in a query also names "The Glass Ferry": keep the longest name
    named = [(t, x) for t, x in named if not any(t != o and t in o and _named(o, query) for o, _ in named)]
    for _, text in named:
        for relation in asked:
            m = relation.pattern.search(text)
            if m:
                return {"evidence": _sentence(text, m.start(), m.end()), "answer": m.group(1).strip()}
    return None


def reply(excerpt: str, query: str) -> str:
    """The subagent's reply text: the finding JSON, or the prompt's abstention."""
    return json.dumps(read(excerpt, query) or ABSTENTION, ensure_ascii=False)


def reply_to_prompt(prompt: Any) -> str:
    """Reply to a rendered subagent prompt (`parser/engine/prompts/v1/subagent.txt` in a chat template):
    its excerpt and query are read back from the text; a prompt without them gets the abstention."""
    if isinstance(prompt, str):
        text = prompt
    else:  # chat messages (the OpenAI chat path)
        text = "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
    excerpt, query = _EXCERPT.search(text), None
    for query in _QUERY.finditer(text):
        pass
    if excerpt is None or query is None:
        return json.dumps(ABSTENTION)
    return reply(excerpt.group(1), query.group(1))
