"""What a method leaves behind for one sample: a `Trace`, one of three kinds, read by attribute.

Why a type: the trace used to be a plain dict in one of four shapes (an episode's trajectory plus
a method's extras, the sequential readers' dict, full-context's, the template's), and the viewer,
the report, the demo and `parser.cli.ask` each read it by string key, so a renamed field failed far
from its cause or silently read a default. Now each kind is a class:

- `Trajectory` ("episode", `parser.records.trajectory`): the episode engine's rounds; a method's
  own part (LongHarness's rounds, RAG's `index_s`, DCI's `tool_calls`) is in its `extras`.
- `SequentialTrace` ("sequential"): a reader that passes over the chunks one by one (MemAgent,
  ReMemR1, CoA; `parser.methods.sequential`).
- `CallTrace` ("call"): a method that answers in direct model calls (full-context, the
  template); its fields are the method's own and nothing reads them but the viewer's JSON view.

On disk a trace is the row's `record` object, exactly the keys it always had, plus `kind`
(`dump_trace`). Rows written before `kind` existed are sniffed (`load_trace`): "turns" means an
episode, "reading_order" a sequential pass, anything else a call.

    trace = load_trace(row["record"]); trace.kind; dump_trace(trace) == {**row["record"], "kind": trace.kind}
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar, Mapping

from parser.records.trajectory import Trajectory


class Trace(abc.ABC):
    """One sample's trace. `to_dict` is its JSON object without `kind`; `from_dict` reads one back."""

    kind: ClassVar[str]

    @abc.abstractmethod
    def to_dict(self) -> dict[str, Any]: ...

    @classmethod
    @abc.abstractmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trace: ...


@dataclasses.dataclass
class SequentialTrace(Trace):
    """A sequential reader's pass: the chunks in the order read, each update, and the final call."""

    kind: ClassVar[str] = "sequential"

    num_chunks: int
    reading_order: list[int]  # chunk indices in the order read
    order: str = ""  # the reading-order strategy's name
    order_s: float = 0.0  # time spent choosing the order
    chunk_paragraphs: list[list[int]] = dataclasses.field(default_factory=list)  # paragraph ids in each chunk
    final_reply: str = ""
    extracted_by: str = ""  # how the answer was taken from the final reply
    empty_final_reply: bool = False
    updates: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # per chunk read: its reply's fields
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)  # what the final call answered from (final_memory, ...)

    @property
    def planner_calls(self) -> int | None:
        """A planning reader's plans (InfMem's `plans`, one planner call each); None for a reader that does not plan."""
        return len(self.extras["plans"]) if "plans" in self.extras else None

    @property
    def stopped_early(self) -> bool | None:
        """Whether a planning reader stopped before the last chunk (InfMem's `stopped_early`); None for one that does not plan."""
        return bool(self.extras.get("stopped_early")) if "plans" in self.extras else None

    def to_dict(self) -> dict[str, Any]:
        """The keys in the order the readers always wrote them (the final call's inputs before its reply)."""
        return {"num_chunks": self.num_chunks, "order": self.order, "reading_order": self.reading_order,
                "order_s": self.order_s, "chunk_paragraphs": self.chunk_paragraphs, **self.extras,
                "final_reply": self.final_reply, "extracted_by": self.extracted_by,
                "empty_final_reply": self.empty_final_reply, "updates": self.updates}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SequentialTrace:
        named = {f.name for f in dataclasses.fields(cls)} - {"extras"}
        return cls(**{k: v for k, v in d.items() if k in named},
                   extras={k: v for k, v in d.items() if k not in named and k != "kind"})


@dataclasses.dataclass
class CallTrace(Trace):
    """Direct model calls (full-context: both turns, the prompt size; the template: its reply)."""

    kind: ClassVar[str] = "call"

    fields: dict[str, Any] = dataclasses.field(default_factory=dict)  # the method's own, as it wrote them

    def to_dict(self) -> dict[str, Any]:
        return dict(self.fields)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CallTrace:
        return cls({k: v for k, v in d.items() if k != "kind"})


# The episode kind lives with the engine's other records and imports nothing of this module, so
# the import goes one way: it is a Trace by registration, not by inheritance.
Trace.register(Trajectory)
KINDS: dict[str, type] = {cls.kind: cls for cls in (Trajectory, SequentialTrace, CallTrace)}


def dump_trace(trace: Trace) -> dict[str, Any]:
    """The trace's JSON object on disk: its own keys, then `kind` (read back by `load_trace`)."""
    return {**trace.to_dict(), "kind": trace.kind}


def load_trace(d: Mapping[str, Any]) -> Trace:
    """The trace `dump_trace` wrote, or one written before `kind` existed (sniffed by its keys)."""
    kind = d.get("kind") or ("episode" if "turns" in d else "sequential" if "reading_order" in d else "call")
    if kind not in KINDS:
        raise ValueError(f"unknown trace kind {kind!r} (known: {', '.join(KINDS)})")
    return KINDS[kind].from_dict(d)
