"""LongHarness's state: the evidence ledger and the conclusions, with their lifecycle rules.

The lead never sees a growing history; each turn it sees the question and this state, rendered
within a token budget (`render`). Everything here is deterministic and model-free, so the state
machine is tested with a scripted lead (tests/test_longharness_on_cpu.py):

    state = HarnessState("Who founded X?", sources={"chunk 0": text0, ...}, max_stalls=2)
    outcome = state.add_evidence("chunk 0", "Ann founded X.", query="who founded X", conclusion="C1", round_=0)
    state.retire("E1", "superseded", by="E2", reason="later record", round_=1)
    state.set_conclusion("C1", "Ann", "supported", ["E2"], needs="", round_=1)

Rules (docs/longharness.md marks which come from the abstract and which are this project's):
- Evidence is `current`, `superseded` (by a named current item) or `retracted` (with a reason).
  Retiring an item withdraws it from every conclusion that rested on it; a resolved conclusion
  left without support reopens, with the reason in its history (corrections reach conclusions).
- A quote must occur in its source (whitespace-collapsed, case-folded) and hold an informative
  word (`parser.text.quotes.informative_words`: ".", "the" or a zero-width joiner occur in any
  source and say nothing), else it is refused and counted; an item already current with the same source and quote is a duplicate, not new.
- A conclusion is `open`, `supported`, `revised` (statement changed, supported anew), `refuted`
  or `unresolved` (closed after `max_stalls` queries that brought no new current evidence).
  `supported`, `revised` and `refuted` need at least one current evidence id, else the change
  is refused and counted (a new conclusion claimed without support is kept, as `open`). `C1` is the question's own conclusion; the answer resolves it.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, Mapping

from parser.text.quotes import informative_words

QUESTION = "C1"
EVIDENCE_STATUSES = ("current", "superseded", "retracted")
RESOLVED = ("supported", "revised")
CLOSED = ("refuted", "unresolved")
CONCLUSION_STATUSES = ("open", *RESOLVED, *CLOSED)
_SPACE = re.compile(r"\s+")


# line breaks a JSON string literal leaves raw (ensure_ascii=False) but a reader may still break a line at
_LINE_BREAKS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def shown(text: str) -> str:
    """Text from outside the state (a quote, a finding, a statement or query the lead copied from one)
    as the state shows it: one JSON string literal, so a newline, a quote mark or a line separator in
    it is escaped and a document line such as `C1 [supported] (the question): ...` stays inside the
    quotes of the item it belongs to; it can never read as a state line of its own."""
    literal = json.dumps(text, ensure_ascii=False)
    for char, escape in _LINE_BREAKS.items():
        literal = literal.replace(char, escape)
    return literal


def normalized(text: str) -> str:
    """What the quote check compares: whitespace runs collapsed, case folded."""
    return _SPACE.sub(" ", text).strip().casefold()


@dataclasses.dataclass
class Evidence:
    id: str
    source: str  # "chunk 3" (readers) or "doc_00017.txt:4" (corpus: file and line)
    quote: str  # verbatim from the source (checked)
    query: str  # the query that acquired it
    conclusion: str  # the conclusion that query served
    round: int
    answer: str = ""  # the reader's short answer, when a reader found it
    status: str = "current"
    reason: str | None = None
    superseded_by: str | None = None
    retired_round: int | None = None


@dataclasses.dataclass
class Conclusion:
    id: str
    statement: str
    status: str = "open"
    evidence: list[str] = dataclasses.field(default_factory=list)
    needs: str = ""  # for open ones: what information would resolve it
    round: int = 0
    stalls: int = 0  # queries for it that brought no new current evidence
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # every change, in order


@dataclasses.dataclass
class Counters:
    """What the lifecycle refused or folded, for the trajectory and the report."""

    quotes_refused: int = 0  # quote not found in its source, or with no informative word
    unknown_sources: int = 0
    duplicates: int = 0
    citations_refused: int = 0  # ids cited that are not current evidence
    updates_refused: int = 0  # conclusion changes or retirements the rules refused
    stalls: int = 0  # queries that added no new current evidence
    closed_unresolved: int = 0


class HarnessState:
    """The ledger and the conclusions of one episode. `sources` maps a source name to its text
    (a chunk, a corpus file); quotes are checked against it."""

    def __init__(self, question: str, sources: Mapping[str, str], *, max_stalls: int = 2, max_conclusions: int = 12,
                 max_quote_chars: int = 300):
        if max_stalls < 1 or max_conclusions < 1 or max_quote_chars < 1:
            raise ValueError("HarnessState: max_stalls, max_conclusions and max_quote_chars must be >= 1")
        self.question = question
        self.sources = {name: normalized(text) for name, text in sources.items()}
        self.max_stalls, self.max_conclusions, self.max_quote_chars = max_stalls, max_conclusions, max_quote_chars
        self.evidence: dict[str, Evidence] = {}
        self.conclusions: dict[str, Conclusion] = {
            QUESTION: Conclusion(QUESTION, "unknown: the answer to the question", needs="the answer to the question")}
        self.counters = Counters()
        self.answer: str | None = None
        self.answer_evidence: list[str] = []
        self.asked: list[dict[str, Any]] = []  # every query run: conclusion, query, round, new evidence ids

    # -- evidence -----------------------------------------------------------------------------
    def current(self, evidence_id: str) -> bool:
        item = self.evidence.get(evidence_id)
        return item is not None and item.status == "current"

    def add_evidence(self, source: str, quote: str, *, query: str, conclusion: str, round_: int, answer: str = "") -> str:
        """Ledger a quote. Returns "added:E<n>", "duplicate:E<n>", or "refused:<why>" (counted)."""
        quote = quote.strip()[: self.max_quote_chars].strip()
        if source not in self.sources:
            self.counters.unknown_sources += 1
            return "refused:unknown_source"
        if not quote or normalized(quote) not in self.sources[source]:
            self.counters.quotes_refused += 1
            return "refused:quote_not_in_source"
        if not informative_words(quote):
            self.counters.quotes_refused += 1
            return "refused:quote_says_nothing"
        key = normalized(quote)
        for item in self.evidence.values():
            if item.status == "current" and item.source == source and normalized(item.quote) == key:
                self.counters.duplicates += 1
                return f"duplicate:{item.id}"
        evidence_id = f"E{len(self.evidence) + 1}"
        self.evidence[evidence_id] = Evidence(evidence_id, source, quote, query, conclusion, round_, answer)
        return f"added:{evidence_id}"

    def retire(self, evidence_id: str, status: str, *, by: str | None, reason: str, round_: int) -> str | None:
        """Supersede (by a current item) or retract (with a reason) one current item; returns the
        refusal, or None. Conclusions resting on it lose it; a resolved one left bare reopens."""
        item = self.evidence.get(evidence_id)
        problem = None
        if item is None or item.status != "current":
            problem = f"{evidence_id} is not current evidence"
        elif status == "superseded" and (by == evidence_id or not by or not self.current(by)):
            problem = f"{evidence_id} can only be superseded by another current evidence id, got {by!r}"
        elif status == "retracted" and not reason.strip():
            problem = f"retracting {evidence_id} needs a reason"
        elif status not in ("superseded", "retracted"):
            problem = f"unknown retirement {status!r}"
        if problem:
            self.counters.updates_refused += 1
            return problem
        item.status, item.reason, item.retired_round = status, reason.strip() or None, round_
        item.superseded_by = by if status == "superseded" else None
        note = f"{evidence_id} {status}" + (f" by {by}" if status == "superseded" else "") + (f": {reason}" if reason else "")
        for conclusion in self.conclusions.values():
            if evidence_id not in conclusion.evidence:
                continue
            conclusion.evidence = [e for e in conclusion.evidence if e != evidence_id]
            change = {"round": round_, "note": f"support withdrawn: {note}"}
            if not conclusion.evidence and conclusion.status in (*RESOLVED, "refuted"):
                change["status"] = conclusion.status = "open"
            conclusion.history.append(change)
        if self.answer is not None and evidence_id in self.answer_evidence:
            self.answer_evidence = [e for e in self.answer_evidence if e != evidence_id]
        return None

    # -- conclusions ----------------------------------------------------------------------------
    def set_conclusion(self, conclusion_id: str | None, statement: str, status: str, evidence: list[str], *,
                       needs: str, round_: int) -> tuple[str | None, str | None]:
        """Add (unknown id) or revise a conclusion. Returns (its id, the refusal or None).
        Cited ids that are not current evidence are dropped and counted; a status that needs
        support and has none left is refused (the conclusion stays as it was)."""
        valid = [e for e in dict.fromkeys(evidence) if self.current(e)]
        self.counters.citations_refused += len(set(evidence)) - len(valid)
        if status not in CONCLUSION_STATUSES or status == "unresolved":
            self.counters.updates_refused += 1
            return conclusion_id, f"status {status!r} cannot be set by the lead"
        unsupported = None
        if status != "open" and not valid:
            self.counters.updates_refused += 1
            unsupported = f"a {status} conclusion must cite current evidence"
        existing = self.conclusions.get(conclusion_id or "")
        if existing is None:
            if len(self.conclusions) >= self.max_conclusions:
                self.counters.updates_refused += 1
                return None, f"at most {self.max_conclusions} conclusions"
            # a new claim without support is not lost: it is kept open, to be checked by a query
            new_id, note = f"C{len(self.conclusions) + 1}", "added" if unsupported is None else f"added open: {unsupported}"
            status = "open" if unsupported else "supported" if status == "revised" else status
            self.conclusions[new_id] = Conclusion(new_id, statement.strip(), status, valid, needs.strip() if status == "open" else "",
                                                  round_, history=[{"round": round_, "status": status,
                                                                    "statement": statement.strip(), "evidence": valid, "note": note}])
            return new_id, unsupported
        if unsupported:
            return existing.id, unsupported
        if existing.status == "unresolved":
            self.counters.updates_refused += 1
            return existing.id, f"{existing.id} was closed as unresolved"
        statement = statement.strip() or existing.statement
        if existing.status in RESOLVED and status in RESOLVED and statement != existing.statement:
            status = "revised"
        change = {"round": round_, "status": status, "evidence": valid}
        if statement != existing.statement:
            change["statement"], change["was"] = statement, existing.statement
        existing.statement, existing.status, existing.evidence = statement, status, valid
        existing.needs = needs.strip() if status == "open" else ""
        existing.history.append(change)
        return existing.id, None

    def open_ids(self) -> list[str]:
        return [c.id for c in self.conclusions.values() if c.status == "open"]

    def asked_before(self, conclusion_id: str, query: str) -> bool:
        return any(a["conclusion"] == conclusion_id and normalized(a["query"]) == normalized(query) for a in self.asked)

    def note_query(self, conclusion_id: str, query: str, new_evidence: list[str], round_: int) -> None:
        """A query that served `conclusion_id` brought `new_evidence`: none counts against it,
        and `max_stalls` such queries close it as unresolved (bounded exploration)."""
        conclusion = self.conclusions[conclusion_id]
        self.asked.append({"conclusion": conclusion_id, "query": query, "round": round_, "new": list(new_evidence)})
        if new_evidence:
            return
        conclusion.stalls += 1
        self.counters.stalls += 1
        if conclusion.stalls >= self.max_stalls and conclusion.status == "open":
            conclusion.status = "unresolved"
            self.counters.closed_unresolved += 1
            conclusion.history.append({"round": round_, "status": "unresolved",
                                       "note": f"{conclusion.stalls} queries brought no new evidence"})

    def give_answer(self, text: str, evidence: list[str], round_: int) -> bool:
        """The answer, resting on the cited current evidence; it resolves the question's
        conclusion. False (and counted) when no cited id is current evidence."""
        valid = [e for e in dict.fromkeys(evidence) if self.current(e)]
        self.counters.citations_refused += len(set(evidence)) - len(valid)
        if not text.strip() or not valid:
            return False
        self.answer, self.answer_evidence = text.strip(), valid
        question = self.conclusions[QUESTION]
        status = "revised" if question.status in RESOLVED and question.statement != self.answer else "supported"
        question.history.append({"round": round_, "status": status, "statement": self.answer, "evidence": valid,
                                 "note": "answer"})
        question.statement, question.status, question.evidence, question.needs = self.answer, status, valid, ""
        return True

    def supported(self, conclusion_id: str) -> bool:
        """Every cited id of a resolved conclusion resolves to a verified quote in its source."""
        conclusion = self.conclusions[conclusion_id]
        return conclusion.status in RESOLVED and bool(conclusion.evidence) and all(
            self.current(e) and normalized(self.evidence[e].quote) in self.sources[self.evidence[e].source]
            for e in conclusion.evidence)

    # -- the view -----------------------------------------------------------------------------
    def eviction_order(self) -> list[str]:
        """Item ids in the order the rendered view drops them when over budget (C1 never):
        1 retired evidence, 2 current evidence no conclusion cites, 3 closed conclusions,
        4 evidence only resolved conclusions cite, 5 resolved conclusions, 6 the remaining
        evidence, 7 open conclusions; oldest first within each."""
        cited_by: dict[str, set[str]] = {}
        for c in self.conclusions.values():
            for e in c.evidence:
                cited_by.setdefault(e, set()).add(c.status)
        evidence = list(self.evidence.values())
        others = [c for c in self.conclusions.values() if c.id != QUESTION]
        ranks = [
            [e.id for e in evidence if e.status != "current"],
            [e.id for e in evidence if e.status == "current" and e.id not in cited_by],
            [c.id for c in others if c.status in CLOSED],
            [e.id for e in evidence if e.status == "current" and e.id in cited_by and cited_by[e.id] <= set(RESOLVED)],
            [c.id for c in others if c.status in RESOLVED],
            [e.id for e in evidence if e.status == "current" and e.id in cited_by and not cited_by[e.id] <= set(RESOLVED)],
            [c.id for c in others if c.status == "open"],
        ]
        return [item for rank in ranks for item in rank]

    def render(self, hidden: set[str] = frozenset(), rounds_left: int = 0, final: bool = False) -> str:
        """The state as the lead reads it, without the `hidden` items (say how many). One line per
        item; every text from outside the state is a quoted literal (`shown`)."""
        lines = ["Conclusions:"]
        for c in self.conclusions.values():
            if c.id in hidden:
                continue
            tag = " (the question)" if c.id == QUESTION else ""
            line = f"{c.id} [{c.status}]{tag}: {shown(c.statement)}"
            if c.evidence:
                line += f" | evidence: {', '.join(c.evidence)}"
            if c.status == "open":
                line += f" | needs: {shown(c.needs) if c.needs else '?'} | stalls: {c.stalls}/{self.max_stalls}"
            lines.append(line)
        current = [e for e in self.evidence.values() if e.status == "current" and e.id not in hidden]
        retired = [e for e in self.evidence.values() if e.status != "current" and e.id not in hidden]
        lines.append("Evidence:" if current else "Evidence: none yet")
        for e in current:
            lines.append(f"{e.id} [{e.source}] {shown(e.quote)} (query {shown(e.query)} for {e.conclusion}, round {e.round + 1})")
        for e in retired:
            by = f" by {e.superseded_by}" if e.superseded_by else ""
            lines.append(f"{e.id} [{e.status}{by}]" + (f": {shown(e.reason)}" if e.reason else ""))
        if hidden:
            lines.append(f"Not shown (state budget): {', '.join(sorted(hidden, key=_id_order))}")
        opened = self.open_ids()
        lines.append(f"Open conclusions a query may serve: {', '.join(opened) if opened else 'none'}")
        lines.append("This is the last turn: give the answer now." if final else f"Rounds left: {rounds_left}")
        return "\n".join(lines)

    def fit(self, fits: Callable[[str], bool], rounds_left: int, final: bool) -> tuple[str, list[str]]:
        """The fullest rendering that `fits`, dropping items in `eviction_order`; returns the
        text and the ids left out. Raises ValueError if even the bare question conclusion does not fit."""
        hidden: list[str] = []
        order = self.eviction_order()
        while True:
            text = self.render(set(hidden), rounds_left, final)
            if fits(text):
                return text, hidden
            if len(hidden) == len(order):
                raise ValueError("longharness: state_token_budget is too small for the question and its conclusion C1; "
                                 "raise method.state_token_budget")
            hidden.append(order[len(hidden)])

    def snapshot(self) -> dict[str, Any]:
        """The whole state (nothing evicted) as plain JSON, for the trajectory."""
        return {"evidence": [dataclasses.asdict(e) for e in self.evidence.values()],
                "conclusions": [dataclasses.asdict(c) for c in self.conclusions.values()],
                "counters": dataclasses.asdict(self.counters), "asked": [dict(a) for a in self.asked],
                "answer": self.answer, "answer_evidence": list(self.answer_evidence)}


def _id_order(item: str) -> tuple[str, int]:
    return item[0], int(item[1:]) if item[1:].isdigit() else 0
