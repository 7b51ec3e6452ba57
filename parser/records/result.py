"""One eval result row and one timing line, each defined once: `eval.run` writes them, the
report, learning summary, viewer and RULER tables read them by attribute.

Why a type: the row used to be a ~25-key dict built in `eval.run` and read back by string key
in four modules, so a renamed field failed far from its cause (or silently read a default).
On disk a row is still one JSON object with the same keys (`to_dict`), so files written before
this type existed load unchanged (`from_dict`): only the key fields are required, every field
added later has the default an older row implies (no `session`/`finished_at`: a row the report
cannot time by session; no `sub_em_release`: not scored that way). A row that cannot be read is
refused with `DataError` naming the file, line and field, and the store skips it.

The metrics are `row.scores`, keyed by the names of `parser.records.metrics.METRICS` (the one
list); on disk each is still a top-level key. The method's trace is `row.trace`, a typed
`parser.records.trace.Trace`; on disk it is still the `record` object.

    row = ResultRow.from_dict(json_object, source="run/results.jsonl:7")
    row.key, row.score("sub_em"), row.scores, row.trace, row.to_dict()
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from parser.records.metrics import METRICS
from parser.records.sample import DataError
from parser.records.trace import Trace, dump_trace, load_trace

Key = tuple[str, int, "str | None", int, str]  # ResultRow.key: (dataset, length, condition, run, sample_id)


def _int(row: Mapping[str, Any], field: str, source: str, default: Any = ...) -> Any:
    value = row.get(field)
    if value is None:
        if default is ...:
            _missing(field, source)
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise DataError(f"{source}: field {field!r} must be an integer, got {type(value).__name__} {str(value)[:40]}")
    try:
        number = int(value)
    except (ValueError, OverflowError):
        raise DataError(f"{source}: field {field!r} must be an integer, got {value!r:.40}") from None
    if number != value and str(number) != value:
        raise DataError(f"{source}: field {field!r} must be an integer, got {value!r:.40}")
    return number


def _float(row: Mapping[str, Any], field: str, source: str, default: Any) -> Any:
    value = row.get(field)
    if value is None:
        return default
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)):
        raise DataError(f"{source}: field {field!r} must be a number, got {type(value).__name__} {str(value)[:40]}")
    return float(value)


def _str(row: Mapping[str, Any], field: str, source: str, default: Any) -> Any:
    value = row.get(field)
    if value is None:
        return default
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise DataError(f"{source}: field {field!r} must be a string, got {type(value).__name__} {str(value)[:40]}")
    return str(value)


def _dict(row: Mapping[str, Any], field: str, source: str) -> dict[str, Any] | None:
    value = row.get(field)
    if value is not None and not isinstance(value, dict):
        raise DataError(f"{source}: field {field!r} must be an object, got {type(value).__name__}")
    return value


@dataclasses.dataclass
class ResultRow:
    """One finished sample of one run of one subset (`eval.run.result_row`)."""

    dataset: str
    length: int  # paragraphs L of the packed documents
    run: int
    sample_id: str
    condition: str | None = None  # controlled analyses only
    condition_index: int | None = None
    method: str = ""
    row: str = ""  # the table row (`report.row`, plus the variant)
    variant: str | None = None  # "w/o RL" / "w/ RL" (Table 7)
    backbone: str = ""
    question: str = ""
    answers: list[str] = dataclasses.field(default_factory=list)
    prediction: str | None = None
    # by the names of `parser.records.metrics.METRICS`; a metric the row predates is absent
    scores: dict[str, float] = dataclasses.field(default_factory=dict)
    steps: int = 0  # sequential model rounds on the critical path
    wall_s: float = 0.0
    lead_output_tokens: int = 0
    subagent_output_tokens: int = 0
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)  # the sample's other record fields
    finished: str = ""  # ISO time
    finished_at: float | None = None  # epoch seconds; with `session`, times a subset whose session was killed
    session: str = ""  # "{pid}@{start}": one process's pass over one subset
    concurrency: int | None = None
    trace: Trace | None = None  # the method's trace, with `save_records` (on disk: `record`)

    @property
    def key(self) -> Key:
        """The row's identity in the store: (dataset, length, condition, run, sample id)."""
        return (self.dataset, self.length, self.condition, self.run, self.sample_id)

    @property
    def gold_paragraph_ids(self) -> list[int] | None:
        """The sample's gold "Document i" numbers (its record's `gold_paragraph_ids`), None where it has none."""
        gold = self.meta.get("gold_paragraph_ids")
        return gold if isinstance(gold, list) else None

    @property
    def evidence_order(self) -> list[int] | None:
        """The same numbers in reasoning order (the record's `evidence_order`), None where it has none."""
        order = self.meta.get("evidence_order")
        return order if isinstance(order, list) else None

    @property
    def control(self) -> str | None:
        """Which factor a controlled set varies (`meta.control`, data_prep.controlled), None outside one."""
        packing = self.meta.get("meta")
        control = packing.get("control") if isinstance(packing, dict) else None
        return str(control) if control else None

    def score(self, metric: str) -> float:
        """The value of one metric by name (`parser.records.metrics.PRIMARY`, ...); a row without it is an error."""
        if metric not in self.scores:
            raise KeyError(f"result row {self.key} has no {metric!r} score")
        return self.scores[metric]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object on disk: every field in declaration order, each metric a key of its own
        (null where the row predates it), the trace as `record` only when kept."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "scores":
                out.update({m.name: value.get(m.name) for m in METRICS})
            elif field.name == "trace":
                if value is not None:
                    out["record"] = dump_trace(value)
            else:
                out[field.name] = value
        return out

    @classmethod
    def from_dict(cls, row: Mapping[str, Any], source: str = "<result row>") -> "ResultRow":
        """Read a row written by `to_dict`, or by eval.run before this type; `DataError` names
        `source` and the field. Keys this type does not know are ignored."""
        if not isinstance(row, Mapping):
            raise DataError(f"{source}: expected a JSON object, got {type(row).__name__}")
        answers = row.get("answers") or []
        if not isinstance(answers, list):
            raise DataError(f"{source}: field 'answers' must be a list, got {type(answers).__name__}")
        return cls(
            dataset=_str(row, "dataset", source, None) or _missing("dataset", source),
            length=_int(row, "length", source),
            run=_int(row, "run", source),
            sample_id=_str(row, "sample_id", source, None) or _missing("sample_id", source),
            condition=_str(row, "condition", source, None),
            condition_index=_int(row, "condition_index", source, None),
            method=_str(row, "method", source, ""),
            row=_str(row, "row", source, ""),
            variant=_str(row, "variant", source, None),
            backbone=_str(row, "backbone", source, ""),
            question=_str(row, "question", source, ""),
            answers=[str(a) for a in answers],
            prediction=_str(row, "prediction", source, None),
            scores={m.name: score for m in METRICS if (score := _float(row, m.name, source, None)) is not None},
            steps=_int(row, "steps", source, 0),
            wall_s=_float(row, "wall_s", source, 0.0),
            lead_output_tokens=_int(row, "lead_output_tokens", source, 0),
            subagent_output_tokens=_int(row, "subagent_output_tokens", source, 0),
            meta=_dict(row, "meta", source) or {},
            finished=_str(row, "finished", source, ""),
            finished_at=_float(row, "finished_at", source, None),
            session=_str(row, "session", source, ""),
            concurrency=_int(row, "concurrency", source, None),
            trace=_trace(row, source),
        )


def _trace(row: Mapping[str, Any], source: str) -> Trace | None:
    record = _dict(row, "record", source)
    if record is None:
        return None
    try:
        return load_trace(record)
    except (TypeError, ValueError, KeyError, AttributeError) as error:  # a trace of no known shape
        raise DataError(f"{source}: field 'record' is not a trace: {error}"[:300]) from None


def _missing(field: str, source: str) -> Any:
    raise DataError(f"{source}: a row without its key (missing field {field!r})")


@dataclasses.dataclass
class TimingLine:
    """One subset pass of one session (`timings.jsonl`): its wall time and what it finished,
    so latency amortizes over resumes (`eval.report.latency_table`)."""

    dataset: str
    length: int
    run: int
    condition: str | None = None
    method: str = ""
    row: str = ""
    backbone: str = ""
    concurrency: int | None = None
    samples: int = 0  # rows this pass wrote
    failed: int = 0
    wall_s: float = 0.0
    pid: int | None = None
    session: str = ""
    finished: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, line: Mapping[str, Any], source: str = "<timing line>") -> "TimingLine":
        if not isinstance(line, Mapping):
            raise DataError(f"{source}: expected a JSON object, got {type(line).__name__}")
        return cls(
            dataset=_str(line, "dataset", source, None) or _missing("dataset", source),
            length=_int(line, "length", source),
            run=_int(line, "run", source, 0),
            condition=_str(line, "condition", source, None),
            method=_str(line, "method", source, ""),
            row=_str(line, "row", source, ""),
            backbone=_str(line, "backbone", source, ""),
            concurrency=_int(line, "concurrency", source, None),
            samples=_int(line, "samples", source, 0),
            failed=_int(line, "failed", source, 0),
            wall_s=_float(line, "wall_s", source, 0.0),
            pid=_int(line, "pid", source, None),
            session=_str(line, "session", source, ""),
            finished=_str(line, "finished", source, ""),
        )
