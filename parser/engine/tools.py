"""Tool sets: what an agent run by `parser.engine.episode.EpisodeEngine` can call, and what it is told.

The engine owns the loop (generate -> parse -> execute -> append -> repeat) and the token view;
a `Toolset` owns everything tool-specific: the schemas given to the chat template, the system
and user prompts, the invalid-action hint, `execute(calls)`, which turns the turn's calls
into observation messages (one `tool` message per call, in call order) plus records for the
trajectory, and its `rules` (`TurnRules`): the hooks by which a baseline's reference protocol
departs from Algorithm 1 (a plain reply as the answer, a continuation prompt after a cut turn,
compaction of older tool results, a tool-free finalize turn, a prompt rendered from state instead
of the appended history). So ParSer, agentic RAG, the DCI agent/subagent and LongHarness share one loop:

    engine = EpisodeEngine(lead, tokenizer, reader, config)
    await engine.run(question, chunks, doc_id=...)             # ParSer: QueryAgents over chunks
    await engine.run_tools(question, RetrievalTools(...))      # parser.methods.rag
    await engine.run_tools(question, SandboxTools(...))        # parser.engine.sandbox.tools
    await engine.run_tools(question, HarnessTurns(...))        # parser.methods.longharness (a StatePrompt)

`QueryAgents` is ParSer's one tool, the scatter–gather of paper Algorithm 1: each query goes to
every chunk's reader concurrently (queries of one turn too), with a per-request timeout and
retries with backoff (`parser.serving.retry`: timeouts and retryable `BackendError`s); a timeout or a
`BackendError` that is final is recorded as a failed call and treated as an abstention — it
never kills the episode. Any other exception from a reader is a bug and propagates. Replies are
gathered into one bounded observation per query (`parser.engine.gather`). The lead never sees a chunk.

Whose prompts, tool schema, hint and observation `QueryAgents` uses is its protocol object's
(`parser.engine.protocol`: this project's, or the authors' release's); a call the release rejects
(unknown tool, empty query) carries its error, which is the tool reply.

`FunctionTools` is the base for tool sets made of plain async functions (`arguments -> text`):
a failing function becomes an "Error: ..." observation, never an exception.

    config, rules = with_turn_rules(cfg["episode"], "dci")       # parser.base.config; a composed method config
    SandboxTools(sandbox, rules=TurnRules.from_section(rules))   # configs/episode/dci.yaml `turn_rules:`
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Awaitable, Callable, Protocol

from parser.engine import prompts
from parser.engine import protocol as protocols
from parser.text.actions import TOOL_NAME, LeadAction, ToolCall
from parser.text.chunking import Chunk
from parser.base.config import EpisodeConfig
from parser.serving.retry import CallFailed, RetryPolicy
from parser.records.trajectory import QueryRecord, SubagentCall


@dataclasses.dataclass
class ToolResult:
    """What one turn's calls produced: the observation messages and the trajectory records."""

    messages: list[dict[str, Any]]
    queries: list[QueryRecord] = dataclasses.field(default_factory=list)  # -> Turn.queries
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # -> Turn.tool_calls
    not_run: int = 0  # calls answered "not run" by the tool set's own bound -> Turn.calls_not_run


def not_run(made: int, limit: int, version: str) -> str:
    """The tool reply to a call past a turn's fan-out bound: it is not run, and the lead is told."""
    return prompts.render("call_not_run", version, made=made, limit=limit)


@dataclasses.dataclass(frozen=True)
class TurnRules:
    """Where a tool set's reference protocol departs from Algorithm 1, as hooks the engine calls
    at fixed points of its loop. All off (the default) is Algorithm 1: ParSer's `QueryAgents`.

    `plain_reply_is_answer` (DCI) and `continue_cut_turns` (DCI, RAG) keep the appended token
    view. `compact_after_chars` (DCI's zero-LLM compaction: once the tool results exceed N
    characters, all but the last `keep_recent_results` become a placeholder) and `finalize_turn`
    (after `max_turns`, one tool-free turn asks for the answer) are eval-only: the next prompts are
    re-rendered from the messages (compacted, or without the tool schemas) — what the reference's
    chat server does — so they are not the appended stream and the trajectory has no token view
    (verl 0.9.1's `AgentLoopOutput` takes exactly one prompt/response segment). Training runs only
    `QueryAgents`, which has none of these.

    `state` (eval-only; set in code by a method, never from a config section) is a `StatePrompt`:
    every turn's prompt is rendered from the tool set's state, never the appended history
    (LongHarness).
    """

    plain_reply_is_answer: bool = False
    continue_cut_turns: bool = False
    finalize_turn: bool = False  # eval-only
    compact_after_chars: int | None = None  # eval-only
    keep_recent_results: int = 12
    state: "StatePrompt | None" = None  # eval-only

    @classmethod
    def from_section(cls, section: dict[str, Any], where: str = "turn_rules") -> "TurnRules":
        """From a config section; an unknown key is refused by name (`state` is no config value)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"state"}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"{where}: unknown turn rule(s) {unknown}; TurnRules has {sorted(known)}")
        return cls(**section)

    def reply_answer(self, content: str, cut: bool) -> str | None:
        """The answer given by a turn with neither a usable call nor an `<answer>`, if any."""
        if self.plain_reply_is_answer and not cut and content and "<tool_call>" not in content:
            return content
        return None

    def continuation(self, cut: bool, version: str) -> str | None:
        """The user message after a cut turn without a call (None: the invalid-action hint)."""
        return prompts.render("continue", version) if cut and self.continue_cut_turns else None

    def compact(self, messages: list[dict[str, Any]], version: str) -> bool:
        """Replace older tool results in `messages` by a placeholder; True if history changed."""
        results = [m for m in messages if m["role"] == "tool"]
        if self.compact_after_chars is None or sum(len(m["content"]) for m in results) <= self.compact_after_chars:
            return False
        placeholder, changed = prompts.render("compacted", version), False
        for message in results[: max(len(results) - self.keep_recent_results, 0)]:
            changed |= message["content"] != placeholder
            message["content"] = placeholder
        return changed

    def finalize_prompt(self, version: str) -> str | None:
        """After `max_turns` without an answer: the user message of one tool-free answer turn."""
        return prompts.render("finalize", version) if self.finalize_turn else None


class StatePrompt(Protocol):
    """The turn rule of a tool set whose lead sees state, not history (LongHarness). The engine
    calls it at fixed points of its own loop, which keeps the turns, budgets, retries, fan-out
    bounds, progress events and the trajectory. Before each turn `messages` gives the whole prompt
    (`measure(messages)`: its length in lead tokens, rendered as the engine renders it) and
    `sampling` the turn's decoding constraint (e.g. `{"json_schema": ...}`); `read` turns the reply
    into the turn's action, whose calls run through the tool set's `execute`; nothing is appended
    (what the calls bring is in the state the next prompt renders); `end_turn` closes the turn and
    returns the stop reason when the episode ends there. The prompt is re-rendered each turn, so
    there is no token view (`token_view_note` says so; `constraints` are recorded in place of the
    lead's action constraint, which does not apply)."""

    token_view_note: str
    constraints: list[str]

    def messages(self, turn_index: int, turns_left: int,
                 measure: Callable[[list[dict[str, Any]]], int]) -> list[dict[str, Any]]: ...

    def sampling(self) -> dict[str, Any]: ...

    def read(self, text: str, thinking_open: bool) -> LeadAction: ...

    def end_turn(self, answered: bool) -> str | None: ...


class Toolset(Protocol):
    names: tuple[str, ...]  # the tools the agent may call; calls to other names are invalid actions
    rules: TurnRules  # the loop's hooks (TurnRules() = Algorithm 1)

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style function schemas for `apply_chat_template(tools=...)`."""
        ...

    def system_prompt(self) -> str: ...

    def user_prompt(self, question: str) -> str: ...

    def invalid_action(self, error: str) -> str:
        """The hint appended after a turn with neither a usable call nor an answer."""
        ...

    async def execute(self, calls: list[ToolCall]) -> ToolResult: ...


@dataclasses.dataclass
class ReaderReply:
    """One chunk reader's answer to one query: the reply text and what it cost."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class ChunkReader(Protocol):
    """What answers one query about one chunk (`parser.engine.readers`: the paper's frozen subagent, a
    thinking subagent, a DCI subagent). `QueryAgents` is its consumer, so the protocol lives here.

    A reader may raise `BackendError` (or time out); `QueryAgents` retries it and records what
    still fails (`parser.serving.retry`). Any other exception is a bug in the reader and ends the episode.
    `forget(doc_id)` drops one document's state once its episode is over (the DCI reader's
    per-chunk corpora); `close()` releases what the reader holds. Stateless readers do nothing.
    """

    async def read(self, query: str, chunk: Chunk, doc_id: str) -> ReaderReply: ...

    def forget(self, doc_id: str) -> None: ...

    def close(self) -> None: ...


class QueryAgents:
    """ParSer's `query_agents(query)` over one document's chunks (one instance per episode).

    `slots` bounds the subagent requests in flight; the engine shares one semaphore across all
    its episodes. `count_tokens` measures the observation budget in the lead's tokens. The
    prompts, schema and observation are `protocol`'s.
    """

    names = (TOOL_NAME,)
    rules = TurnRules()  # paper Algorithm 1 as it is

    def __init__(self, reader: ChunkReader, chunks: list[Chunk], doc_id: str, config: EpisodeConfig,
                 protocol: protocols.Protocol, slots: asyncio.Semaphore, count_tokens: Callable[[str], int]):
        if not chunks:
            raise ValueError(f"episode {doc_id!r} has no chunks to read")
        self.reader, self.chunks, self.doc_id = reader, chunks, doc_id
        self.config, self.protocol, self.slots, self.count_tokens = config, protocol, slots, count_tokens
        self.retry = RetryPolicy.of(config)
        self.tool_schemas = protocol.lead_tools()  # read now: a missing release checkout fails before any call

    def schemas(self) -> list[dict[str, Any]]:
        return self.tool_schemas

    def system_prompt(self) -> str:
        return self.protocol.lead_system()

    def user_prompt(self, question: str) -> str:
        return self.protocol.lead_user(question)

    def invalid_action(self, error: str) -> str:
        # neither protocol's hint takes the error: the trained leads' prompts stay as they were
        return self.protocol.invalid_hint()

    async def execute(self, calls: list[ToolCall]) -> ToolResult:
        """One tool message per call, in call order; a call carrying an `error` (the release's
        rejected calls) is answered by it without a scatter. Queries x chunks stay within
        `max_subagent_requests_per_turn` (one query always runs); later queries are "not run"."""
        usable = [c for c in calls if c.error is None]
        limit = max(1, self.config.max_subagent_requests_per_turn // len(self.chunks))
        run = usable[:limit]
        queries = list(await asyncio.gather(*(self.scatter(c.arguments["query"]) for c in run)))
        replies = {id(c): q.observation for c, q in zip(run, queries, strict=True)}
        refused = not_run(len(usable), limit, self.config.prompt_version)
        messages = [{"role": "tool", "name": c.name or TOOL_NAME,
                     "content": c.error if c.error is not None else replies.get(id(c), refused)} for c in calls]
        return ToolResult(messages, queries=queries, not_run=len(usable) - len(run))

    async def scatter(self, query: str) -> QueryRecord:
        started = time.perf_counter()
        calls = await asyncio.gather(*(self._read(query, chunk) for chunk in self.chunks))
        gathered = self.protocol.gather(
            query, [(call.chunk_index, text if call.status != "failed" else None) for call, text in calls], self.count_tokens)
        for (call, text), kept in zip(calls, gathered.kept, strict=True):
            if kept:
                call.status, call.raw = "finding", text
            elif call.status != "failed":
                call.status = "abstain"
        return QueryRecord(query, gathered.findings, [c for c, _ in calls], gathered.observation, gathered.omitted,
                           time.perf_counter() - started)

    async def _read(self, query: str, chunk: Chunk) -> tuple[SubagentCall, str]:
        """One (query, chunk) request with timeout and retries; a final failure becomes a record."""
        started = time.perf_counter()
        try:
            reply, attempts = await self.retry.call(lambda: self.reader.read(query, chunk, self.doc_id), self.slots)
        except CallFailed as failure:
            return SubagentCall(chunk.index, "failed", attempts=failure.attempts, latency_s=time.perf_counter() - started,
                                error=failure.reason), ""
        call = SubagentCall(
            chunk.index, "pending", reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens, attempts, time.perf_counter() - started
        )
        return call, reply.text


ToolFn = Callable[[dict[str, Any]], Awaitable[str]]


class FunctionTools:
    """A tool set of async functions `arguments -> observation text`, run concurrently per turn.

    Subclasses set `functions` (name -> function), `tool_schemas`, the three prompts, and
    `rules` when their reference protocol has any.
    """

    functions: dict[str, ToolFn]
    tool_schemas: list[dict[str, Any]]
    rules: TurnRules = TurnRules()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.functions)

    def schemas(self) -> list[dict[str, Any]]:
        return self.tool_schemas

    async def _call(self, call: ToolCall) -> tuple[str, dict[str, Any]]:
        started = time.perf_counter()
        error = None
        try:
            result = await self.functions[call.name](call.arguments)
        except Exception as exc:  # noqa: BLE001 - a tool failure is an observation, never a crash
            error = f"{type(exc).__name__}: {exc}"
            result = f"Error: {error}"
        record = {"name": call.name, "arguments": call.arguments, "result_chars": len(result),
                  "latency_s": time.perf_counter() - started, "error": error}
        return result, record

    async def execute(self, calls: list[ToolCall]) -> ToolResult:
        done = await asyncio.gather(*(self._call(c) for c in calls))
        messages = [{"role": "tool", "name": c.name, "content": result} for c, (result, _) in zip(calls, done, strict=True)]
        return ToolResult(messages, calls=[record for _, record in done])
