"""What every method shares: the sample it answers, the result it returns, the interface.

Eval, the latency bench and the demo hold methods only through `Method`, so every method sees
the same `Sample`s, is scored by the same metric and reports the same timing fields
(`MethodResult`). Each method config names its class with `_target_` (`parser.methods.build_method`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from parser.records.sample import Record
from parser.records.trace import Trace, dump_trace


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
        """A sample from an eval row, ours or MemAgent's, read by the one record type
        (`parser.records.sample.Record`, with its field rules); errors name `source` (file:line) and the field."""
        return cls.of(Record.from_dict(record, source))

    @classmethod
    def of(cls, record: Record) -> "Sample":
        return cls(id=record.id, question=record.question, answers=list(record.answers), context=record.context,
                   meta=record.sample_meta())


@dataclasses.dataclass
class MethodResult:
    """What every method returns; eval writes `to_dict()` as one JSONL row."""

    answer: str | None
    steps: int  # sequential model rounds on the critical path (ParSer: lead turns; MemAgent: chunks + 1)
    wall_s: float
    lead_output_tokens: int = 0
    subagent_output_tokens: int = 0
    trace: Trace | None = None  # what the method did (an episode's trajectory, a sequential pass, its calls)
    # Set when the sample got no fair run (ParSer: every subagent call failed): eval counts it as
    # failed, not as a wrong answer, keeps the trace in errors.jsonl and retries it on re-run.
    failed: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """One JSON row: the fields, the trace as `record` (its object on disk, `dump_trace`)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "trace"}
        return {**out, "record": dump_trace(self.trace) if self.trace is not None else None}


class Method(Protocol):
    name: str
    # How it reads the document, as `parser ask` and the demo say it after "the document: "; a
    # `{chunks}` in it stands for the protocol's chunk count (methods that have a protocol).
    reading: str

    async def run(self, sample: Sample) -> MethodResult: ...

    async def aclose(self) -> None: ...
