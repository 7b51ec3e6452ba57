"""What one episode leaves behind: the record every consumer reads.

Training reads the token view (`prompt_ids`, `response_ids`, `response_mask`,
`response_logprobs`); eval, the report and the trajectory viewer read the turns, findings,
timings and failures. `to_dict()` is the JSONL row format (token view optional).
"""
from __future__ import annotations

import dataclasses
from typing import Any


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

    def mask_invalid_turns(self, trainable: bool) -> None:
        """Invalid turns' tokens are trained (mask 1) if `trainable`, else masked out
        (`parser.engine.protocol.Protocol.mask_invalid_turns` decides which, once the reward is known)."""
        for start, end in self.invalid_turn_spans:
            self.response_mask[start:end] = [int(trainable)] * (end - start)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

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
        if not with_tokens:
            for key in ("prompt_ids", "response_ids", "response_mask", "response_logprobs"):
                row.pop(key)
        for turn in row["turns"]:
            for query in turn["queries"]:  # keep failures and findings, drop bulky abstention rows
                query["calls"] = [c for c in query["calls"] if c["status"] != "abstain"] + [
                    {"status": "abstain_count", "count": sum(c["status"] == "abstain" for c in query["calls"])}
                ]
        row["stats"] = self.stats()
        row["failures"] = self.failures
        return row
