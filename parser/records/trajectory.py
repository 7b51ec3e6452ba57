"""What one episode leaves behind: the record every consumer reads.

Training reads the token view (`prompt_ids`, `response_ids`, `response_mask`,
`response_logprobs`); eval, the report and the trajectory viewer read the turns, findings,
timings and failures. `to_dict()` is the JSONL row format (token view optional); `from_dict()`
reads it back (an eval row's trace, `parser.records.trace.load_trace`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

ABSTAIN_COUNT = "abstain_count"  # on disk a query's abstentions are one row with their count


def _known(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of `d` that are fields of `cls` (rows keep keys a later version dropped)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}


@dataclasses.dataclass
class Finding:
    """One subagent's non-abstaining reply to one query."""

    agent: str  # "agent_{chunk_index}"
    chunk_index: int
    answer: str
    evidence: str = ""
    merged_agents: list[str] = dataclasses.field(default_factory=list)  # identical answers folded in


@dataclasses.dataclass
class SubagentCall:
    """One (query, chunk) request as it happened: kept for failures and token accounting."""

    chunk_index: int
    status: str  # "finding" | "abstain" | "failed"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    attempts: int = 1
    latency_s: float = 0.0
    error: str | None = None
    raw: str | None = None  # raw text, kept only for findings and failures


@dataclasses.dataclass
class QueryRecord:
    query: str
    findings: list[Finding]
    calls: list[SubagentCall]
    observation: str  # the text the lead saw for this query
    omitted: int = 0  # findings cut by the observation budget
    latency_s: float = 0.0

    @property
    def failures(self) -> int:
        return sum(c.status == "failed" for c in self.calls)

    @classmethod
    def from_dict(cls, q: Mapping[str, Any]) -> QueryRecord:
        """A query as `dataclasses.asdict` or `Trajectory.to_dict` wrote it (abstentions counted:
        each comes back as a call of chunk -1)."""
        calls: list[SubagentCall] = []
        for c in q.get("calls", []):
            if c.get("status") == ABSTAIN_COUNT:
                calls += [SubagentCall(chunk_index=-1, status="abstain") for _ in range(int(c.get("count", 0)))]
            else:
                calls.append(SubagentCall(**_known(SubagentCall, c)))
        return cls(**{**_known(cls, q), "findings": [Finding(**_known(Finding, f)) for f in q.get("findings", [])],
                      "calls": calls})


@dataclasses.dataclass
class Turn:
    index: int
    text: str  # the lead's raw generation this turn
    thinking: str
    queries: list[QueryRecord]
    answer: str | None
    action_error: str | None
    lead_tokens: int
    finish_reason: str  # lead's: "stop" | "length"
    lead_latency_s: float
    scatter_latency_s: float = 0.0  # time in the turn's tool calls (ParSer: the scatter-gather)
    prompt_tokens: int = 0  # the prompt this turn was generated from
    lead_attempts: int = 1  # generations tried (retryable backend errors are retried)
    tool_calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # tools other than query_agents
    calls_not_run: int = 0  # calls past the turn's fan-out bound (answered "not run")


@dataclasses.dataclass
class Trajectory:
    """One episode, the trace kind "episode" (`parser.records.trace` registers it as a `Trace`).
    `extras`: a method's own part, written beside the engine's keys (LongHarness's `longharness`
    rounds, RAG's `index_s`, DCI's `tool_calls`)."""

    kind: ClassVar[str] = "episode"

    question: str
    doc_id: str
    num_chunks: int
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    turns: list[Turn] = dataclasses.field(default_factory=list)
    answer: str | None = None
    # "answer" | "max_turns" | "response_length" | "plain_reply" | "finalize" | "empty_generation" (release protocol)
    stop_reason: str = "max_turns"
    wall_s: float = 0.0
    # token view for training: built by appending, never by re-rendering. False when an eval-only
    # option (compaction, the tool-free finalize turn) made a prompt that is not the appended stream.
    token_view_valid: bool = True
    token_view_note: str | None = None  # why not, when the backend's ids/logprobs were unusable
    constraints: list[str] = dataclasses.field(default_factory=list)  # constrained decoding in effect
    prompt_ids: list[int] = dataclasses.field(default_factory=list)
    response_ids: list[int] = dataclasses.field(default_factory=list)
    response_mask: list[int] = dataclasses.field(default_factory=list)  # 1 = lead-generated
    response_logprobs: list[float] = dataclasses.field(default_factory=list)
    # [start, end) in response_ids of each invalid turn's generated tokens (for a protocol's mask rule)
    invalid_turn_spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)

    def mask_invalid_turns(self, trainable: bool) -> None:
        """Invalid turns' tokens are trained (mask 1) if `trainable`, else masked out
        (`parser.engine.protocol.Protocol.mask_invalid_turns` decides which, once the reward is known)."""
        for start, end in self.invalid_turn_spans:
            self.response_mask[start:end] = [int(trainable)] * (end - start)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def sub_calls(self) -> int:
        """Requests to the model that reads for the lead: RLM's `llm_query` prompts where its part
        records them (`extras.rlm.usage.sub.calls`, parser.methods.rlm), else the subagent calls."""
        rlm = self.extras.get("rlm")
        if rlm:
            return rlm["usage"]["sub"]["calls"]
        return sum(len(q.calls) for t in self.turns for q in t.queries)

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [
            {"turn": t.index, "query": q.query, "chunk_index": c.chunk_index, "error": c.error, "attempts": c.attempts}
            for t in self.turns
            for q in t.queries
            for c in q.calls
            if c.status == "failed"
        ]

    def stats(self) -> dict[str, float]:
        """Per-trajectory metrics (training logs them per step, eval per sample)."""
        queries = [q for t in self.turns for q in t.queries]
        calls = [c for q in queries for c in q.calls]
        return {
            "num_turns": self.num_turns,
            "lead_tokens": sum(t.lead_tokens for t in self.turns),
            "lead_tokens_per_turn": sum(t.lead_tokens for t in self.turns) / max(self.num_turns, 1),
            "queries_per_turn": len(queries) / max(self.num_turns, 1),
            "findings_per_query": sum(len(q.findings) for q in queries) / max(len(queries), 1),
            "invalid_actions": sum(t.action_error is not None for t in self.turns),
            "subagent_calls": len(calls),
            "subagent_failures": sum(c.status == "failed" for c in calls),
            "subagent_prompt_tokens": sum(c.prompt_tokens for c in calls),
            "subagent_completion_tokens": sum(c.completion_tokens for c in calls),
            "subagent_cached_tokens": sum(c.cached_tokens for c in calls),
            "answered": float(self.answer is not None),
            "wall_s": self.wall_s,
        }

    def to_dict(self, with_tokens: bool = False) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        extras = row.pop("extras")
        if not with_tokens:
            for key in ("prompt_ids", "response_ids", "response_mask", "response_logprobs"):
                row.pop(key)
        for turn in row["turns"]:
            for query in turn["queries"]:  # keep failures and findings, drop bulky abstention rows
                query["calls"] = [c for c in query["calls"] if c["status"] != "abstain"] + [
                    {"status": ABSTAIN_COUNT, "count": sum(c["status"] == "abstain" for c in query["calls"])}
                ]
        row["stats"] = self.stats()
        row["failures"] = self.failures
        return {**row, **extras}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trajectory:
        """Read `to_dict`'s object back. Abstentions were kept only as a count, and their tokens
        only in the stored `stats` totals: each comes back as a call of chunk -1, the first one
        carrying those tokens, so `stats()` and `to_dict()` give what was written."""
        derived = {"stats", "failures", "kind"}
        fields = {f.name for f in dataclasses.fields(cls)}
        turns = [Turn(**{**_known(Turn, t), "queries": [QueryRecord.from_dict(q) for q in t.get("queries", [])]})
                 for t in d.get("turns", [])]
        trajectory = cls(**{**_known(cls, d), "turns": turns,
                            "invalid_turn_spans": [tuple(span) for span in d.get("invalid_turn_spans", [])],
                            "extras": {k: v for k, v in d.items() if k not in fields and k not in derived}})
        abstained = [c for t in turns for q in t.queries for c in q.calls if c.status == "abstain"]
        if abstained and d.get("stats"):
            unseen = {name: int(d["stats"].get(f"subagent_{name}", 0)) for name in ("prompt_tokens", "completion_tokens", "cached_tokens")}
            kept = trajectory.stats()
            for name, total in unseen.items():
                setattr(abstained[0], name, total - int(kept[f"subagent_{name}"]))
        return trajectory
