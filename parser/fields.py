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

from typing import Any

from parser.reward import normalize_answer


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


def require_answers(values: Any, field: str, source: str) -> list[str]:
    """Gold answers: a non-empty list of strings (an integer is read as its digits), each
    non-empty once normalized."""
    if not isinstance(values, (list, tuple)) or not values:
        raise DataError(f"{source}: field {field!r} must be a non-empty list of strings, got {type(values).__name__} {str(values)[:60]}")
    answers = []
    for i, value in enumerate(values):
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            raise DataError(f"{source}: {field}[{i}] must be a string, got {type(value).__name__} {str(value)[:60]}")
        if not scorable(value):
            raise DataError(f"{source}: {field}[{i}] = {value!r} normalizes to nothing; it would match every prediction")
        answers.append(value)
    return answers
