"""What every method shares: the sample it answers, the result it returns, the interface.

Eval, the latency bench and the demo hold methods only through `Method`, so every method sees
the same `Sample`s, is scored by the same metric and reports the same timing fields
(`MethodResult`). Each method config names its class with `_target_` (`parser.methods.build_method`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from parser.fields import DataError, require, require_answers, require_text


@dataclasses.dataclass
class Sample:
    """One eval/training item. `context` is the packed document; the lead never sees it."""

    id: str
    question: str
    answers: list[str]
    context: str
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_record(cls, record: dict[str, Any], source: str = "<record>") -> "Sample":
        """Accept the project's eval rows and MemAgent's (`input`, `answers`, `context`, `index`),
        with the field rules data prep applies (`parser.fields`): a text question and context,
        gold answers that can score. Errors name `source` (file:line) and the field."""
        if not isinstance(record, dict):
            raise DataError(f"{source}: expected a JSON object, got {type(record).__name__}")
        question_field = "question" if record.get("question") is not None else "input"
        answers_field = next((f for f in ("answers", "golden_answers", "outputs") if record.get(f) is not None), "answers")
        question = require_text(record, question_field, source)
        answers = require(record, answers_field, source)
        answers = require_answers([answers] if isinstance(answers, str) else answers, answers_field, source)
        context = require_text(record, "context", source)
        sample_id = record.get("id", record.get("index", record.get("_id")))
        if sample_id is None:
            raise DataError(f"{source}: record has no id/index field")
        meta = {k: v for k, v in record.items() if k not in {"question", "input", "answers", "golden_answers", "outputs", "context", "id"}}
        return cls(id=str(sample_id), question=question, answers=answers, context=context, meta=meta)


@dataclasses.dataclass
class MethodResult:
    """What every method returns; eval writes `to_dict()` as one JSONL row."""

    answer: str | None
    steps: int  # sequential model rounds on the critical path (ParSer: lead turns; MemAgent: chunks + 1)
    wall_s: float
    lead_output_tokens: int = 0
    subagent_output_tokens: int = 0
    record: dict[str, Any] = dataclasses.field(default_factory=dict)  # method-specific trace (e.g. a trajectory)
    # Set when the sample got no fair run (ParSer: every subagent call failed): eval counts it as
    # failed, not as a wrong answer, keeps `record` in errors.jsonl and retries it on re-run.
    failed: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Method(Protocol):
    name: str

    async def run(self, sample: Sample) -> MethodResult: ...

    async def aclose(self) -> None: ...
