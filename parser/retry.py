"""The one retry policy for model calls: subagent reads (`parser.tools.QueryAgents`), the lead's
generations (`parser.episode.EpisodeEngine`) and the gateway report's traffic
(`scripts/gateway_report.py`) all go through `retrying`.

Why one place: a transient failure (5xx, dropped connection, timeout) must cost the lead and a
subagent the same backoff, and a validation error (4xx, `BackendError.retryable=False`) must
fail fast for both instead of being repeated `max_attempts` times.

    async for attempt in retrying(max_attempts=4, backoff_s=0.5):
        with attempt:
            completion = await backend.generate(prompt, sampling)
"""
from __future__ import annotations

import asyncio

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from parser.backends.base import BackendError


def is_retryable(error: BaseException) -> bool:
    """Timeouts and `BackendError(retryable=True)`; anything else fails at once."""
    return isinstance(error, asyncio.TimeoutError) or (isinstance(error, BackendError) and error.retryable)


def retrying(max_attempts: int, backoff_s: float, max_backoff_s: float = 30.0) -> AsyncRetrying:
    """Exponential backoff with jitter from `backoff_s` (capped at `max_backoff_s`); re-raises the last error."""
    return AsyncRetrying(
        stop=stop_after_attempt(max_attempts),
        wait=wait_exponential_jitter(multiplier=backoff_s, max=max_backoff_s, jitter=backoff_s),
        retry=retry_if_exception(is_retryable),
        reraise=True,
    )
