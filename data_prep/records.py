"""The shared in-memory form of every source: a `Question` with its own paragraphs, and a `Corpus`.

HotpotQA, FlashRAG 2Wiki and the synthetic world differ only in how they are read; once read
they are all a list of `Question`s plus the sorted set of every paragraph of the split (the
`Corpus` distractors are drawn from). Packing, controlled sets and writers only see this form,
so a new source needs a reader and nothing else.

A paragraph is ``title + "\\n" + "".join(sentences)`` (MemAgent's and ReMemR1's definition).
The field rules (`require_text`, `require_answers`, `DataError`) live in `parser.records.sample`, shared
with the eval loader and the verl parquet checker.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

from parser.records.sample import DataError, require, require_answers, require_text, scorable

__all__ = ["Corpus", "DataError", "Question", "logical_order", "paragraph_text", "require", "require_answers",
           "require_record", "require_text", "unique_ids"]


def paragraph_text(title: str, sentences: Sequence[str] | str) -> str:
    body = sentences if isinstance(sentences, str) else "".join(sentences)
    return f"{title}\n{body}"


@dataclasses.dataclass(frozen=True)
class Question:
    """One multi-hop question and the paragraphs that came with it.

    `paragraphs` are the question's own context (HotpotQA: 2 supporting + 8 distractors), all of
    which a packed sample keeps. `gold` indexes into `paragraphs`, in the source's
    supporting-facts order (ReMemR1's ``evidence_idx`` before shuffling); `logical` is the same
    set in reasoning order (a paragraph that names another gold paragraph's title comes first).
    """

    id: str
    index: int  # the question's row number in its split (MemAgent's `index`)
    question: str
    answers: tuple[str, ...]
    paragraphs: tuple[str, ...]
    gold: tuple[int, ...]
    logical: tuple[int, ...]
    dataset: str
    qtype: str | None = None
    level: str | None = None
    evidences: tuple[tuple[str, str, str], ...] = ()
    # `compat` sources (the authors' readers): every supporting fact's paragraph, repeats kept
    # (ReMemR1's `evidence_idx` before shuffling); a paragraph repeated in `paragraphs` is kept twice
    support: tuple[int, ...] = ()
    compat: bool = False

    def __post_init__(self) -> None:
        where = f"{self.dataset} question {self.id!r}"
        if not self.question.strip():
            raise DataError(f"{where}: field 'question' is empty")
        if not self.answers:
            raise DataError(f"{where}: field 'answers' is empty")
        for i, answer in enumerate(self.answers):
            if not isinstance(answer, str) or not (self.compat or scorable(answer)):
                raise DataError(f"{where}: answers[{i}] = {answer!r} normalizes to nothing; it would match every prediction")
        if len(set(self.paragraphs)) != len(self.paragraphs) and not self.compat:
            raise DataError(f"{where}: field 'paragraphs' holds duplicates; deduplicate before building")
        for name, idx in (("gold", self.gold), ("logical", self.logical), ("support", self.support)):
            if any(not 0 <= i < len(self.paragraphs) for i in idx):
                raise DataError(f"{where}: field {name!r} indexes outside its {len(self.paragraphs)} paragraphs: {idx}")
        if sorted(set(self.gold)) != sorted(set(self.logical)):
            raise DataError(f"{where}: 'logical' {self.logical} is not a reordering of 'gold' {self.gold}")


class Corpus:
    """The sorted set of all paragraphs of a split; distractors are drawn from it by index."""

    def __init__(self, paragraphs: Iterable[str]):
        self.paragraphs: list[str] = sorted(set(paragraphs))
        self._index = {p: i for i, p in enumerate(self.paragraphs)}

    def __len__(self) -> int:
        return len(self.paragraphs)

    def __getitem__(self, i: int) -> str:
        return self.paragraphs[i]

    def index_of(self, paragraph: str) -> int:
        try:
            return self._index[paragraph]
        except KeyError:
            raise DataError(f"paragraph not in corpus: {paragraph[:80]!r}") from None

    @classmethod
    def from_questions(cls, questions: Iterable[Question], extra: Iterable[str] = ()) -> "Corpus":
        return cls([p for q in questions for p in q.paragraphs] + list(extra))


def logical_order(titles: Sequence[str], gold: Sequence[int], evidences: Iterable[Sequence[str]]) -> tuple[int, ...]:
    """Order gold paragraphs by reasoning dependency, using 2Wiki's evidence triples.

    A gold paragraph whose title is the *subject* of a triple whose *object* is another gold
    paragraph's title comes first. Sorted in layers (every paragraph whose prerequisites are
    met, in supporting-facts order), so a bridge-comparison reads both films, then both
    directors; the reverse puts both directors first. A cycle falls back to source order.
    """
    gold = list(dict.fromkeys(gold))
    by_title: dict[str, int] = {}
    for g in gold:
        by_title.setdefault(titles[g].strip(), g)
    before: dict[int, set[int]] = {g: set() for g in gold}  # g -> paragraphs that must come before g
    for triple in evidences:
        if len(triple) != 3:
            continue
        subject, _, obj = (str(x).strip() for x in triple)
        s, o = by_title.get(subject), by_title.get(obj)
        if s is not None and o is not None and s != o:
            before[o].add(s)
    order: list[int] = []
    remaining = list(gold)
    while remaining:
        done = set(order)
        layer = [g for g in remaining if before[g] <= done] or remaining[:1]
        order.extend(layer)
        remaining = [g for g in remaining if g not in layer]
    return tuple(order)


def require_record(row: Any, source: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise DataError(f"{source}: expected a JSON object, got {type(row).__name__}")
    return row


def unique_ids(ids: Iterable[str], source: str) -> None:
    """Refuse a split whose ids repeat (rows would overwrite each other downstream)."""
    first: dict[str, int] = {}
    for i, row_id in enumerate(ids):
        if row_id in first:
            raise DataError(f"{source}: duplicate id {row_id!r} in records {first[row_id]} and {i}")
        first[row_id] = i
