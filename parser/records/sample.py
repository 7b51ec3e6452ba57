"""The fields of a question-answering record, checked the same way wherever a record enters.

Data prep writes records, the eval loader reads them from files, and the verl parquet checker
reads training rows; a record one of them refuses must not slip through another (answers given
as a dict, a gold that normalizes to nothing and so matches every prediction, a context that is
a list). So the rules live here, once, and every error names the source (file and line or row)
and the field. `DataError` is what they raise; `data_prep.records` re-exports it.

    question = require_text(row, "question", "eval.jsonl:3")
    answers = require_answers(row["answers"], "answers", "eval.jsonl:3")
"""
from __future__ import annotations

import dataclasses
from typing import Any

from parser.text.reward import normalize_answer


class DataError(ValueError):
    """Bad input data; the message names the source (file / record) and the field."""


def require(record: dict[str, Any], field: str, source: str) -> Any:
    """`record[field]`, or a `DataError` naming the source and the missing field (dotted paths ok)."""
    value: Any = record
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value or value[part] is None:
            raise DataError(f"{source}: missing field {field!r}")
        value = value[part]
    return value


def require_text(record: dict[str, Any], field: str, source: str) -> str:
    """A string field that must have content (a list or number where text belongs is an error)."""
    return check_text(require(record, field, source), field, source)


def check_text(value: Any, field: str, source: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{source}: field {field!r} must be a string, got {type(value).__name__} {str(value)[:60]}")
    if not value.strip():
        raise DataError(f"{source}: field {field!r} is empty")
    return value


def scorable(answer: str) -> bool:
    """Whether a gold answer can score: it keeps some text under the scorer's normalization."""
    return bool(normalize_answer(answer))


def compat_row(row: Any) -> bool:
    """Whether a record was written by a `compat` recipe (`meta.compat`, set by data_prep's packing
    of questions read as the authors read them): its golds may normalize to nothing."""
    return isinstance(row, dict) and isinstance(row.get("meta"), dict) and row["meta"].get("compat") is True


def require_answers(values: Any, field: str, source: str, compat: bool = False) -> list[str]:
    """Gold answers: a non-empty list of strings (an integer is read as its digits), each
    non-empty once normalized; with `compat` (the authors' data, read as they read it) a gold
    that normalizes to nothing is kept, and only the `_compat` metrics score it (as theirs: a hit)."""
    if not isinstance(values, (list, tuple)) or not values:
        raise DataError(f"{source}: field {field!r} must be a non-empty list of strings, got {type(values).__name__} {str(values)[:60]}")
    answers = []
    for i, value in enumerate(values):
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            raise DataError(f"{source}: {field}[{i}] must be a string, got {type(value).__name__} {str(value)[:60]}")
        if not (compat or scorable(value)):
            raise DataError(f"{source}: {field}[{i}] = {value!r} normalizes to nothing; it would match every prediction")
        answers.append(value)
    return answers


# The fields a record's own text lives in, under this project's names and the sources' aliases.
_QUESTION_FIELDS = ("question", "input")  # ours; MemAgent's and RULER's
_ANSWER_FIELDS = ("answers", "golden_answers", "outputs")  # ours and MemAgent's; FlashRAG's; RULER's
_ID_FIELDS = ("id", "index", "_id")  # ours; MemAgent's (the row number); HotpotQA's


@dataclasses.dataclass(frozen=True)
class Record:
    """One eval record: the question, its gold answers and the packed document, plus where the
    evidence is. Written by data prep (`to_dict`: MemAgent's fields `index`, `input`, `answers`,
    `context`, `num_docs`, then ours), read by eval (`from_dict`, which also takes MemAgent's,
    FlashRAG's and RULER's files), and the shape of a verl row's `extra_info` (data_prep.verl_parquet).

    Constructing one checks the text fields (`require_text`/`require_answers`' rules), so a
    writer cannot emit a record a reader would refuse."""

    id: str
    question: str
    answers: tuple[str, ...]
    context: str
    index: int | str | None = None  # the question's row in its split (MemAgent's `index`)
    dataset: str | None = None
    length: int | None = None  # paragraphs L (RULER: tokens)
    num_docs: int | None = None  # MemAgent's name for L
    gold_paragraph_ids: tuple[int, ...] | None = None  # sorted 1-based "Document i" numbers
    evidence_order: tuple[int, ...] | None = None  # the same numbers, in reasoning order
    meta: dict[str, Any] | None = None  # packing and source details (ReMemR1's evidence fields, type, level, seed)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # a source's other fields, kept as read
    source: str = dataclasses.field(default="<record>", compare=False)  # file:line, for error messages

    @property
    def compat(self) -> bool:
        """Written by a `compat` recipe (`meta.compat`): a gold that normalizes to nothing is kept."""
        return compat_row({"meta": self.meta})

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise DataError(f"{self.source}: field 'id' must be a non-empty string, got {self.id!r:.60}")
        check_text(self.question, "question", self.source)
        check_text(self.context, "context", self.source)
        object.__setattr__(self, "answers", tuple(require_answers(list(self.answers), "answers", self.source, self.compat)))
        for name in ("length", "num_docs"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise DataError(f"{self.source}: field {name!r} must be a positive integer, got {value!r:.60}")
        for name in ("gold_paragraph_ids", "evidence_order"):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, (list, tuple)) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
                    raise DataError(f"{self.source}: field {name!r} must be a list of integers, got {value!r:.60}")
                object.__setattr__(self, name, tuple(value))
        if self.meta is not None and not isinstance(self.meta, dict):
            raise DataError(f"{self.source}: field 'meta' must be an object, got {type(self.meta).__name__}")
        if self.dataset is not None and not isinstance(self.dataset, str):
            raise DataError(f"{self.source}: field 'dataset' must be a string, got {type(self.dataset).__name__}")

    @classmethod
    def from_dict(cls, row: Any, source: str = "<record>") -> "Record":
        """Read our eval rows and MemAgent's / FlashRAG's / RULER's; errors name `source` and the field."""
        if not isinstance(row, dict):
            raise DataError(f"{source}: expected a JSON object, got {type(row).__name__}")
        question_field = next((f for f in _QUESTION_FIELDS if row.get(f) is not None), "question")
        answers_field = next((f for f in _ANSWER_FIELDS if row.get(f) is not None), "answers")
        question = require_text(row, question_field, source)
        answers = require(row, answers_field, source)
        answers = require_answers([answers] if isinstance(answers, str) else answers, answers_field, source, compat_row(row))
        context = require_text(row, "context", source)
        record_id = next((row[f] for f in _ID_FIELDS if row.get(f) is not None), None)
        if record_id is None:
            raise DataError(f"{source}: record has no id/index field")
        known = {"index", "dataset", "length", "num_docs", "gold_paragraph_ids", "evidence_order", "meta"}
        core = {*_QUESTION_FIELDS, *_ANSWER_FIELDS, "context", "id"}
        return cls(id=str(record_id), question=question, answers=tuple(answers), context=context,
                   **{name: row[name] for name in known if name in row},
                   extra={k: v for k, v in row.items() if k not in core and k not in known}, source=source)

    def to_dict(self) -> dict[str, Any]:
        """The eval row data prep writes: MemAgent's fields, then ours (fields that are None are left out)."""
        out = {"index": self.index, "input": self.question, "answers": list(self.answers), "context": self.context,
               "num_docs": self.num_docs, "id": self.id, "question": self.question, "dataset": self.dataset,
               "length": self.length,
               "gold_paragraph_ids": None if self.gold_paragraph_ids is None else list(self.gold_paragraph_ids),
               "evidence_order": None if self.evidence_order is None else list(self.evidence_order),
               "meta": self.meta, **self.extra}
        return {k: v for k, v in out.items() if v is not None}

    def sample_meta(self) -> dict[str, Any]:
        """Every field but the question, answers, context and id: what a result row keeps as `meta`."""
        out = {"index": self.index, "num_docs": self.num_docs, "dataset": self.dataset, "length": self.length,
               "gold_paragraph_ids": None if self.gold_paragraph_ids is None else list(self.gold_paragraph_ids),
               "evidence_order": None if self.evidence_order is None else list(self.evidence_order), "meta": self.meta}
        return {**{k: v for k, v in out.items() if v is not None}, **self.extra}
