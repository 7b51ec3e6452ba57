"""The episode engine: paper Algorithm 1, the one scatter–gather loop of the project.

Training (the verl agent loop), eval, the baselines that reuse the lead, and the demo all run
`EpisodeEngine.run`; behaviour differences are `EpisodeConfig` values, never a second loop.

One turn: the lead generates from the exact token stream it has seen so far -> its output is
parsed (`parser.actions`) -> an answer ends the episode; queries are scattered to every chunk's
reader concurrently (queries of one turn concurrently too) -> replies are gathered into one
observation per query (`parser.gather`) -> the observation is appended -> repeat until an answer
or `max_turns`. Unusable output gets the invalid-action hint and the loop continues.

The token view for training is built by *appending* what the model actually saw — never by
re-rendering history (Qwen3.5's template drops earlier `<think>` blocks, which would break the
prefix property). Generated tokens get mask 1; observation and template tokens mask 0. A turn
cut at its token limit is closed with the end-of-turn token (mask 0) before the observation.

Subagent failures are retried with backoff; what still fails is recorded in the trajectory and
treated as an abstention — it never kills the episode. The lead never sees a chunk.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from parser import gather, prompts
from parser.actions import parse_lead_output, split_thinking
from parser.backends.base import Backend, BackendError, SamplingParams
from parser.chunking import Chunk
from parser.reader import ChunkReader
from parser.trajectory import Finding, QueryRecord, SubagentCall, Trajectory, Turn

END_OF_TURN = "<|im_end|>"


@dataclasses.dataclass
class EpisodeConfig:
    """Defaults are the paper's training settings (Table 9); eval overrides them in
    `configs/episode/eval.yaml` (12 turns, chunk 4096, lead temperature 0)."""

    max_turns: int = 9
    max_tokens_per_turn: int = 2048
    max_response_tokens: int | None = None  # verl's rollout.response_length; None = unbounded
    chunk_size: int = 512  # subagent chunk, tokens of the subagent tokenizer
    lead_temperature: float = 1.0
    lead_top_p: float = 1.0
    lead_top_k: int = -1
    lead_thinking: bool = True
    subagent_temperature: float = 0.7
    subagent_max_tokens: int = 512
    observation_token_budget: int = 4096  # per query; what is cut is said
    merge_identical_answers: bool = True
    max_concurrency: int = 512  # subagent requests in flight per engine (all its episodes)
    request_timeout_s: float = 300.0
    max_attempts: int = 4  # per subagent request, for retryable errors (5xx, connection, timeout)
    retry_backoff_s: float = 0.5  # first backoff; grows exponentially with jitter
    prompt_version: str = prompts.DEFAULT_VERSION


def _retryable(error: BaseException) -> bool:
    return isinstance(error, asyncio.TimeoutError) or (isinstance(error, BackendError) and error.retryable)


class LeadContext:
    """The lead's token stream and chat messages, grown by appending only."""

    def __init__(self, tokenizer: Any, question: str, config: EpisodeConfig):
        self.tokenizer = tokenizer
        self.config = config
        self.template_kwargs = {"enable_thinking": config.lead_thinking}
        self.tools = prompts.lead_tools(config.prompt_version)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompts.render("lead_system", config.prompt_version)},
            {"role": "user", "content": prompts.render("lead_user", config.prompt_version, question=question)},
        ]
        self.prompt_ids: list[int] = self._encode(self._render(self.messages, add_generation_prompt=True))
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.end_of_turn_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=add_generation_prompt, **self.template_kwargs
        )

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    @property
    def stream(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def append_generation(self, token_ids: list[int], logprobs: list[float] | None) -> None:
        self.response_ids += token_ids
        self.response_mask += [1] * len(token_ids)
        self.response_logprobs += list(logprobs) if logprobs and len(logprobs) == len(token_ids) else [0.0] * len(token_ids)
        if not token_ids or token_ids[-1] != self.end_of_turn_id:  # cut at the limit: close the turn
            self._append_context([self.end_of_turn_id])

    def _append_context(self, token_ids: list[int]) -> None:
        self.response_ids += token_ids
        self.response_mask += [0] * len(token_ids)
        self.response_logprobs += [0.0] * len(token_ids)

    def observation_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Tokens the template puts between the assistant's end-of-turn and the next generation.

        Rendered after a fixed stand-in history, so it depends only on `messages`: exactly the
        template's rendering of the tool (or hint) turn plus the generation prompt.
        """
        marker = "\u2063parser-stand-in\u2063"
        history = [self.messages[0], {"role": "user", "content": "?"}, {"role": "assistant", "content": marker}]
        rendered = self._render(history + messages, add_generation_prompt=True)
        end = rendered.find(END_OF_TURN, rendered.rindex(marker))
        if end < 0:
            raise RuntimeError(f"chat template does not close assistant turns with {END_OF_TURN}")
        return self._encode(rendered[end + len(END_OF_TURN):])

    def append_observation(self, messages: list[dict[str, Any]]) -> None:
        self._append_context(self.observation_ids(messages))
        self.messages += messages


class EpisodeEngine:
    """Runs episodes for one lead backend and one chunk reader; safe to share across tasks."""

    def __init__(self, lead: Backend, lead_tokenizer: Any, reader: ChunkReader, config: EpisodeConfig | None = None):
        self.lead = lead
        self.tokenizer = lead_tokenizer
        self.reader = reader
        self.config = config or EpisodeConfig()
        self._slots = asyncio.Semaphore(self.config.max_concurrency)

    def _count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    async def run(self, question: str, chunks: list[Chunk], doc_id: str = "doc", request_id: str | None = None) -> Trajectory:
        if not chunks:
            raise ValueError(f"episode {doc_id!r} has no chunks to read")
        cfg = self.config
        started = time.perf_counter()
        context = LeadContext(self.tokenizer, question, cfg)
        trajectory = Trajectory(question=question, doc_id=doc_id, num_chunks=len(chunks), prompt_ids=context.prompt_ids)
        for turn_index in range(cfg.max_turns):
            budget = cfg.max_tokens_per_turn
            if cfg.max_response_tokens is not None:
                budget = min(budget, cfg.max_response_tokens - len(context.response_ids))
                if budget <= 0:
                    trajectory.stop_reason = "response_length"
                    break
            sampling = SamplingParams(
                max_new_tokens=budget, temperature=cfg.lead_temperature, top_p=cfg.lead_top_p, top_k=cfg.lead_top_k, return_logprobs=True
            )
            lead_started = time.perf_counter()
            completion = await self.lead.generate(context.stream, sampling, request_id=request_id or doc_id)
            lead_latency = time.perf_counter() - lead_started
            token_ids = completion.token_ids or self.tokenizer.encode(completion.text, add_special_tokens=False)
            text = completion.text if completion.text else self.tokenizer.decode(token_ids, skip_special_tokens=False)
            text = text.removesuffix(END_OF_TURN)
            context.append_generation(token_ids, completion.logprobs)
            action = parse_lead_output(text)
            context.messages.append({"role": "assistant", "content": split_thinking(text)[1].strip(), "reasoning_content": action.thinking})
            turn = Turn(
                index=turn_index, text=text, thinking=action.thinking, queries=[], answer=action.answer,
                action_error=action.error, lead_tokens=len(token_ids), finish_reason=completion.finish_reason,
                lead_latency_s=lead_latency,
            )
            trajectory.turns.append(turn)
            if action.answer is not None:
                trajectory.answer = action.answer
                trajectory.stop_reason = "answer"
                break
            if action.queries:
                scatter_started = time.perf_counter()
                turn.queries = list(await asyncio.gather(*(self._scatter(q, chunks, doc_id) for q in action.queries)))
                turn.scatter_latency_s = time.perf_counter() - scatter_started
                observation = [{"role": "tool", "name": "query_agents", "content": q.observation} for q in turn.queries]
            else:
                observation = [{"role": "user", "content": prompts.render("invalid_action", cfg.prompt_version)}]
            context.append_observation(observation)
        trajectory.messages = context.messages
        trajectory.response_ids = context.response_ids
        trajectory.response_mask = context.response_mask
        trajectory.response_logprobs = context.response_logprobs
        trajectory.wall_s = time.perf_counter() - started
        return trajectory

    async def _scatter(self, query: str, chunks: list[Chunk], doc_id: str) -> QueryRecord:
        started = time.perf_counter()
        calls = await asyncio.gather(*(self._read(query, chunk, doc_id) for chunk in chunks))
        findings = []
        for chunk, (call, text) in zip(chunks, calls):
            parsed = gather.parse_reply(text) if call.status != "failed" else None
            if parsed:
                call.status, call.raw = "finding", text
                findings.append(Finding(agent=f"agent_{chunk.index}", chunk_index=chunk.index, answer=parsed[0], evidence=parsed[1]))
            elif call.status != "failed":
                call.status = "abstain"
        if self.config.merge_identical_answers:
            findings = gather.merge_identical(findings)
        observation, omitted = gather.render_observation(
            query, findings, len(chunks), self._count_tokens, self.config.observation_token_budget, self.config.prompt_version
        )
        return QueryRecord(query, findings, [c for c, _ in calls], observation, omitted, time.perf_counter() - started)

    async def _read(self, query: str, chunk: Chunk, doc_id: str) -> tuple[SubagentCall, str]:
        """One (query, chunk) request with timeout and retries; failures become a record."""
        cfg = self.config
        started = time.perf_counter()
        attempts = 0
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(cfg.max_attempts),
                wait=wait_exponential_jitter(multiplier=cfg.retry_backoff_s, max=30.0, jitter=cfg.retry_backoff_s),
                retry=retry_if_exception(_retryable),
                reraise=True,
            ):
                with attempt:
                    attempts += 1
                    async with self._slots:
                        reply = await asyncio.wait_for(self.reader.read(query, chunk, doc_id), cfg.request_timeout_s)
        except Exception as error:  # noqa: BLE001 - any reader failure is recorded, never raised
            message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            return SubagentCall(chunk.index, "failed", attempts=attempts, latency_s=time.perf_counter() - started, error=message), ""
        call = SubagentCall(
            chunk.index, "pending", reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens, attempts, time.perf_counter() - started
        )
        return call, reply.text
