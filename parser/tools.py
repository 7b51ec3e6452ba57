"""Tool sets: what an agent run by `parser.episode.EpisodeEngine` can call, and what it is told.

The engine owns the loop (generate -> parse -> execute -> append -> repeat) and the token view;
a `Toolset` owns everything tool-specific: the schemas given to the chat template, the system
and user prompts, the invalid-action hint, and `execute(calls)`, which turns the turn's calls
into observation messages (one `tool` message per call, in call order) plus records for the
trajectory. So ParSer, agentic RAG and the DCI agent/subagent share one loop:

    engine = EpisodeEngine(lead, tokenizer, reader, config)
    await engine.run(question, chunks, doc_id=...)             # ParSer: QueryAgents over chunks
    await engine.run_tools(question, RetrievalTools(...))      # parser.methods.rag
    await engine.run_tools(question, SandboxTools(...))        # parser.dci

`QueryAgents` is ParSer's one tool, the scatter–gather of paper Algorithm 1: each query goes to
every chunk's reader concurrently (queries of one turn too), with a per-request timeout and
retries with backoff (`parser.retry`: timeouts and retryable `BackendError`s); a timeout or a
`BackendError` that is final is recorded as a failed call and treated as an abstention — it
never kills the episode. Any other exception from a reader is a bug and propagates. Replies are
gathered into one bounded observation per query (`parser.gather`). The lead never sees a chunk.

With `protocol="release"`, `QueryAgents` speaks the authors' release (`parser.protocol`): its
prompts and tool schema, its invalid-step hint, its JSON observation (`parser.gather`), and a
call the release rejects (unknown tool, empty query) answered by its error as the tool reply.

`FunctionTools` is the base for tool sets made of plain async functions (`arguments -> text`):
a failing function becomes an "Error: ..." observation, never an exception.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Awaitable, Callable, Protocol

from parser import gather, prompts
from parser import protocol as release
from parser.actions import TOOL_NAME, ToolCall
from parser.chunking import Chunk
from parser.config import EpisodeConfig
from parser.retry import CallFailed, RetryPolicy
from parser.trajectory import Finding, QueryRecord, SubagentCall


@dataclasses.dataclass
class ToolResult:
    """What one turn's calls produced: the observation messages and the trajectory records."""

    messages: list[dict[str, Any]]
    queries: list[QueryRecord] = dataclasses.field(default_factory=list)  # -> Turn.queries
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # -> Turn.tool_calls


class Toolset(Protocol):
    names: tuple[str, ...]  # the tools the agent may call; calls to other names are invalid actions

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
    """What answers one query about one chunk (`parser.readers`: the paper's frozen subagent, a
    thinking subagent, a DCI subagent). `QueryAgents` is its consumer, so the protocol lives here.

    A reader may raise `BackendError` (or time out); `QueryAgents` retries it and records what
    still fails (`parser.retry`). Any other exception is a bug in the reader and ends the episode.
    `forget(doc_id)` drops one document's state once its episode is over (the DCI reader's
    per-chunk corpora); `close()` releases what the reader holds. Stateless readers do nothing.
    """

    async def read(self, query: str, chunk: Chunk, doc_id: str) -> ReaderReply: ...

    def forget(self, doc_id: str) -> None: ...

    def close(self) -> None: ...


class QueryAgents:
    """ParSer's `query_agents(query)` over one document's chunks (one instance per episode).

    `slots` bounds the subagent requests in flight; the engine shares one semaphore across all
    its episodes. `count_tokens` measures the observation budget in the lead's tokens.
    """

    names = (TOOL_NAME,)

    def __init__(self, reader: ChunkReader, chunks: list[Chunk], doc_id: str, config: EpisodeConfig,
                 slots: asyncio.Semaphore, count_tokens: Callable[[str], int]):
        if not chunks:
            raise ValueError(f"episode {doc_id!r} has no chunks to read")
        self.reader, self.chunks, self.doc_id = reader, chunks, doc_id
        self.config, self.slots, self.count_tokens = config, slots, count_tokens
        self.retry = RetryPolicy.of(config)
        self.release = (release.load_release_prompts(config.protocol_release.get("repo"))
                        if release.check_protocol(config.protocol) == "release" else None)

    def schemas(self) -> list[dict[str, Any]]:
        return self.release.tools if self.release else prompts.lead_tools(self.config.prompt_version)

    def system_prompt(self) -> str:
        return self.release.lead_system if self.release else prompts.render("lead_system", self.config.prompt_version)

    def user_prompt(self, question: str) -> str:
        if self.release:
            return release.USER_TURN.format(question=question)
        return prompts.render("lead_user", self.config.prompt_version, question=question)

    def invalid_action(self, error: str) -> str:
        # neither hint takes an error field: the trained leads' prompts stay as they were
        return self.release.invalid_hint if self.release else prompts.render("invalid_action", self.config.prompt_version)

    async def execute(self, calls: list[ToolCall]) -> ToolResult:
        """One tool message per call, in call order; a call carrying an `error` (release protocol)
        is answered by it without a scatter."""
        usable = [c for c in calls if c.error is None]
        queries = list(await asyncio.gather(*(self.scatter(c.arguments["query"]) for c in usable)))
        replies = iter(q.observation for q in queries)
        messages = [{"role": "tool", "name": c.name or TOOL_NAME, "content": c.error if c.error is not None else next(replies)}
                    for c in calls]
        return ToolResult(messages, queries=queries)

    async def scatter(self, query: str) -> QueryRecord:
        started = time.perf_counter()
        calls = await asyncio.gather(*(self._read(query, chunk) for chunk in self.chunks))
        if self.release:
            return self._gather_release(query, calls, started)
        findings = []
        for chunk, (call, text) in zip(self.chunks, calls):
            parsed = gather.parse_reply(text) if call.status != "failed" else None
            if parsed:
                call.status, call.raw = "finding", text
                findings.append(Finding(agent=f"agent_{chunk.index}", chunk_index=chunk.index, answer=parsed[0], evidence=parsed[1]))
            elif call.status != "failed":
                call.status = "abstain"
        if self.config.merge_identical_answers:
            findings = gather.merge_identical(findings)
        observation, omitted = gather.render_observation(
            query, findings, len(self.chunks), self.count_tokens, self.config.observation_token_budget, self.config.prompt_version
        )
        return QueryRecord(query, findings, [c for c, _ in calls], observation, omitted, time.perf_counter() - started)

    def _gather_release(self, query: str, calls: list[tuple[SubagentCall, str]], started: float) -> QueryRecord:
        parsed = [gather.parse_release_reply(text if call.status != "failed" else None) for call, text in calls]
        findings = []
        for chunk, (call, text), kept in zip(self.chunks, calls, parsed):
            if kept:
                call.status, call.raw = "finding", text
                answer = kept.get("answer", "")
                evidence = kept.get("evidence", kept.get(release.RAW_KEY, ""))
                findings.append(Finding(f"agent_{chunk.index}", chunk.index,
                                        answer if isinstance(answer, str) else str(answer),
                                        evidence if isinstance(evidence, str) else str(evidence)))
            elif call.status != "failed":
                call.status = "abstain"
        observation, _ = gather.render_release_observation(parsed)
        return QueryRecord(query, findings, [c for c, _ in calls], observation, 0, time.perf_counter() - started)

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

    Subclasses set `functions` (name -> function), `tool_schemas`, and the three prompts.
    """

    functions: dict[str, ToolFn]
    tool_schemas: list[dict[str, Any]]

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
        messages = [{"role": "tool", "name": c.name, "content": result} for c, (result, _) in zip(calls, done)]
        return ToolResult(messages, calls=[record for _, record in done])
