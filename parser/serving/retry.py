"""The one failure semantics for model calls: what is retried, what is recorded, what surfaces.

Every method reaches its models through `RetryPolicy.call`: the episode engine's lead
generations (ParSer, agentic RAG, the DCI agent and subagent), ParSer's subagent reads
(`parser.engine.tools.QueryAgents`), and the backends of the baselines and the knowledge filter
(`RetryingBackend`: full-context, MemAgent/ReMemR1, `data_prep.knowledge_filter`, InfoMem's
answer scoring). The gateway
report's traffic uses the same tenacity policy (`retrying`).

The rule, stated once:
- a timeout (the per-attempt deadline, or one the backend raises) or a
  `BackendError(retryable=True)` (5xx, dropped connection) is retried with exponential backoff
  and jitter, up to `max_attempts` attempts in all, and each retry says so in one line on
  stderr (`say_retry`: the attempt, the reason, the wait);
- a `BackendError(retryable=False)` (4xx, a prompt longer than the context) is not retried;
- either, once it is final, is raised as `CallFailed` (a `BackendError` that carries the number
  of attempts and the last error): `QueryAgents` records it as a failed subagent call, which
  the lead sees as an abstention; from a lead generation or a baseline's call it fails the sample;
- any other exception is a bug (a reader's `TypeError`, an `AttributeError`) and propagates at
  once: never retried, never turned into a record the lead is told about.

    policy = RetryPolicy.of(episode_config)     # max_attempts, retry_backoff_s, request_timeout_s
    completion, attempts = await policy.call(lambda: backend.generate(prompt, sampling))
    lead = RetryingBackend(backend, policy)     # a Backend, for code that holds one
"""
from __future__ import annotations

import asyncio
import dataclasses
import sys
from typing import Any, Awaitable, Callable, Mapping, Sequence, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from parser.serving.types import BackendError, Completion, Prompt, SamplingParams
from parser.base.config import EpisodeConfig

T = TypeVar("T")
# A baseline's `retry:` section takes EpisodeConfig's names for the same three knobs.
RETRY_KEYS = ("max_attempts", "retry_backoff_s", "request_timeout_s")
MAX_RETRY_LINE_CHARS = 300  # of a retry's line on stderr (a server's error message can be long)


def is_retryable(error: BaseException) -> bool:
    """Timeouts and `BackendError(retryable=True)`; anything else fails at once."""
    return isinstance(error, asyncio.TimeoutError) or (isinstance(error, BackendError) and error.retryable)


def retrying(max_attempts: int, backoff_s: float, max_backoff_s: float = 30.0,
             before_sleep: Callable[[RetryCallState], None] | None = None) -> AsyncRetrying:
    """Exponential backoff with jitter from `backoff_s` (capped at `max_backoff_s`); re-raises the last error."""
    return AsyncRetrying(
        stop=stop_after_attempt(max_attempts),
        wait=wait_exponential_jitter(multiplier=backoff_s, max=max_backoff_s, jitter=backoff_s),
        retry=retry_if_exception(is_retryable),
        before_sleep=before_sleep,
        reraise=True,
    )


def say_retry(state: RetryCallState, max_attempts: int, limit: int = MAX_RETRY_LINE_CHARS) -> None:
    """One line on stderr per retry: which attempt failed, why (a `BackendError` names the URL) and
    when the next starts. A retried call used to be silent until it failed for good, minutes later."""
    error = state.outcome.exception() if state.outcome is not None else None
    reason = (f"{type(error).__name__}: {error}" if str(error) else
              f"{type(error).__name__} (no answer within the attempt's deadline)")
    line = (f"[parser] retry {state.attempt_number + 1} of {max_attempts} "
            f"in {state.next_action.sleep if state.next_action else 0:.1f} s after {reason}")
    print(line if len(line) <= limit else f"{line[:limit]}...", file=sys.stderr, flush=True)


class CallFailed(BackendError):
    """A model call that failed for good: its last error was a timeout or a `BackendError`, and
    it was not retryable or `attempts` reached the policy's limit."""

    def __init__(self, last: BaseException, attempts: int):
        if isinstance(last, CallFailed):  # a call made inside another (the DCI subagent's own episode)
            last = last.last
        self.last, self.attempts = last, attempts
        self.reason = f"{type(last).__name__}: {last}" if str(last) else type(last).__name__
        super().__init__(f"{self.reason} (after {attempts} attempt{'s' if attempts != 1 else ''})", retryable=False,
                         status=getattr(last, "status", None))


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int
    backoff_s: float  # the first backoff; it grows exponentially, with jitter
    timeout_s: float | None  # deadline of one attempt; None: only the backend's own
    max_backoff_s: float = 30.0

    @classmethod
    def of(cls, config: EpisodeConfig) -> RetryPolicy:
        return cls(config.max_attempts, config.retry_backoff_s, config.request_timeout_s)

    @classmethod
    def from_section(cls, section: Mapping[str, Any] | None) -> RetryPolicy:
        """A method's `retry:` config section (`RETRY_KEYS`); a missing key keeps `EpisodeConfig`'s default."""
        section = dict(section or {})
        unknown = sorted(set(section) - set(RETRY_KEYS))
        if unknown:
            raise ValueError(f"retry config: unknown key(s) {unknown}; known: {list(RETRY_KEYS)}")
        return cls.of(EpisodeConfig(**section))

    async def call(self, attempt: Callable[[], Awaitable[T]], slots: asyncio.Semaphore | None = None) -> tuple[T, int]:
        """`(result, attempts)` of `attempt()`, retried by the rule above; raises `CallFailed`.

        `slots`, if given, is held for each attempt only (never during a backoff), and the
        deadline starts once a slot is held, so waiting for a slot never counts as a timeout."""
        attempts = 0
        try:
            async for retry in retrying(self.max_attempts, self.backoff_s, self.max_backoff_s,
                                        before_sleep=lambda state: say_retry(state, self.max_attempts)):
                with retry:
                    attempts += 1
                    if slots is None:
                        result = await within(attempt(), self.timeout_s)
                    else:
                        async with slots:
                            result = await within(attempt(), self.timeout_s)
        except (BackendError, asyncio.TimeoutError) as error:
            raise CallFailed(error, attempts) from error
        return result, attempts


async def within(call: Awaitable[T], timeout_s: float | None) -> T:
    """`await call`, or `asyncio.TimeoutError` past `timeout_s` (None: no deadline).

    Why not `asyncio.wait_for` on Python 3.11: when a cancellation lands just as the call
    completes, 3.11's wait_for returns the result and the cancellation is lost (CPython
    gh-86296, fixed in 3.12). Ctrl-C reaches an eval as one task cancel (`asyncio.run`), so a
    lost one let `eval.run` finish every sample instead of stopping. `asyncio.timeout` (3.11+)
    runs the call in the caller's task, where a cancel is never dropped."""
    if sys.version_info < (3, 11):
        return await asyncio.wait_for(call, timeout_s)
    async with asyncio.timeout(timeout_s):
        return await call


class RetryingBackend:
    """A `Backend` (and `Scorer`) whose calls follow `policy` (for code that holds a backend, not an engine)."""

    def __init__(self, backend: Any, policy: RetryPolicy):
        self.backend, self.policy = backend, policy
        self.renders_chat_template = getattr(backend, "renders_chat_template", False)

    async def generate(self, prompt: Prompt, sampling: SamplingParams, *, routing_key: str | None = None,
                       request_id: str | None = None) -> Completion:
        completion, _ = await self.policy.call(
            lambda: self.backend.generate(prompt, sampling, routing_key=routing_key, request_id=request_id))
        return completion

    async def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], *, routing_key: str | None = None,
                    request_id: str | None = None) -> list[float]:
        """`Scorer.score` under the same policy (answer scoring, `parser.info_gain`)."""
        scores, _ = await self.policy.call(
            lambda: self.backend.score(prompt_ids, continuation_ids, routing_key=routing_key, request_id=request_id))
        return scores

    async def aclose(self) -> None:
        await self.backend.aclose()
