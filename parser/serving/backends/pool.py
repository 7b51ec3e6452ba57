"""A client-side worker pool: pin each chunk to one of several backends, fail over when one dies.

The production path is the sglang-router gateway (`parser/cli/gateway.py`). Without a
gateway — the demo's multi-worker mode, a few local servers, tests — this pool gives the same
two properties: a chunk's requests go to one worker (rendezvous hashing on the routing key, so
its prefix stays in that worker's cache), and a worker that fails is skipped for a cooldown so
the engine's retry of that request lands on the next worker in the key's ranking. The cooldown
doubles with each failure in a row (`cooldown_s`, 2x, 4x, ... up to `max_cooldown_s`) and resets
on a success: a worker that stays dead or hung is re-probed ever more rarely, since each probe of
a hung worker costs one request a full deadline (measured: with a fixed 5 s cooldown a hung
worker held up a scatter round every 5 s, `scripts/gateway_faults.py`).

What counts as a failure of the worker: a retryable `BackendError` (5xx, connection refused or
reset, the backend's own timeout, and every 200 the client refuses: a body over its bound, an
encoding it did not ask for, an SGLang abort; `parser.serving.backends.http` classifies them); a request
the caller gave up on after `hung_after_s` (the engine's `request_timeout_s` cancels it, so the
backend never raises: a hung worker); and an HTTP 200 whose body is not a completion (a parse
error, or `text` that is not a string), re-raised as a retryable `BackendError`. A
non-retryable `BackendError` is a bad request of ours (a 4xx that is not 408/429): it would fail
on every worker, so it neither marks the worker down nor is retried. The retry of a key that just failed on a worker goes to another
worker whenever one is up, even if the cooldown has already run out.

    pool = WorkerPool([HttpBackend(url) for url in urls])

`score` (answer scoring, `parser.serving.types.Scorer`) is routed and failed over the same way.
"""
from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any, Awaitable, Callable, Sequence

from parser.serving.types import Backend, BackendError, Completion, Prompt, SamplingParams


def _score(key: str, worker: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{worker}:{key}".encode(), digest_size=8).digest(), "big")


def _check_completion(completion: Any) -> str | None:
    if not isinstance(completion.text, str):
        return f"response text is {type(completion.text).__name__}, not a string"
    return None


def _check_scores(scores: Any) -> str | None:
    if not isinstance(scores, list):
        return f"scores are {type(scores).__name__}, not a list"
    return None


class WorkerPool:
    def __init__(self, backends: Sequence[Backend], cooldown_s: float = 5.0, hung_after_s: float = 5.0,
                 max_cooldown_s: float = 300.0):
        if not backends:
            raise ValueError("WorkerPool needs at least one backend")
        self.backends = list(backends)
        self.cooldown_s = cooldown_s
        self.max_cooldown_s = max(max_cooldown_s, cooldown_s)
        self.hung_after_s = hung_after_s  # a cancelled request older than this marks its worker down
        self._down_until = [0.0] * len(self.backends)
        self._strikes = [0] * len(self.backends)  # failures in a row: the next cooldown is cooldown_s * 2**(strikes-1)
        self._failed_on: dict[str, int] = {}  # key -> the worker its last attempt failed on
        self._next = 0  # round robin for requests without a key

    @property
    def renders_chat_template(self) -> bool:
        """As its backends (they are built from one config)."""
        return bool(getattr(self.backends[0], "renders_chat_template", False))

    def ranking(self, key: str | None) -> list[int]:
        """Workers in preference order for `key` (stable while the pool's size is)."""
        order = list(range(len(self.backends)))
        if key is None:
            self._next = (self._next + 1) % len(order)
            return order[self._next:] + order[: self._next]
        return sorted(order, key=lambda w: _score(key, w), reverse=True)

    def pick(self, key: str | None) -> int:
        now = time.monotonic()
        ranking = self.ranking(key)
        avoid = self._failed_on.get(key) if key is not None else None
        up = [w for w in ranking if self._down_until[w] <= now]
        return next((w for w in up if w != avoid), up[0] if up else next((w for w in ranking if w != avoid), ranking[0]))

    def _failed(self, worker: int, key: str | None) -> None:
        now = time.monotonic()
        if self._down_until[worker] <= now:  # failures of requests sent before it went down count once
            self._strikes[worker] = min(self._strikes[worker] + 1, 32)
        cooldown = min(self.cooldown_s * 2 ** (self._strikes[worker] - 1), self.max_cooldown_s)
        self._down_until[worker] = max(self._down_until[worker], now + cooldown)
        if key is not None:
            if len(self._failed_on) > 65536:  # keys that never succeed again must not pile up
                self._failed_on.clear()
            self._failed_on[key] = worker

    async def generate(
        self, prompt: Prompt, sampling: SamplingParams, *, routing_key: str | None = None, request_id: str | None = None
    ) -> Completion:
        return await self._call(routing_key, request_id, lambda backend: backend.generate(
            prompt, sampling, routing_key=routing_key, request_id=request_id), _check_completion)

    async def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], *, routing_key: str | None = None,
                    request_id: str | None = None) -> list[float]:
        """`Scorer.score` on the key's worker, with the same failover as `generate`."""
        return await self._call(routing_key, request_id, lambda backend: backend.score(
            prompt_ids, continuation_ids, routing_key=routing_key, request_id=request_id), _check_scores)

    async def _call(self, routing_key: str | None, request_id: str | None,
                    call: Callable[[Any], Awaitable[Any]], check: Callable[[Any], str | None]) -> Any:
        """One request on the key's worker; every kind of failure in the module docstring marks it down."""
        key = routing_key or request_id
        worker = self.pick(key)
        started = time.monotonic()
        try:
            result = await call(self.backends[worker])
        except BackendError as error:
            if error.retryable:
                self._failed(worker, key)
            raise
        except asyncio.CancelledError:  # the caller's timeout: the worker did not answer in time
            if time.monotonic() - started >= self.hung_after_s:
                self._failed(worker, key)
            raise
        except Exception as error:  # noqa: BLE001 - a 200 the backend could not parse: garbage from this worker
            self._failed(worker, key)
            raise BackendError(f"worker {worker}: unusable response ({type(error).__name__}: {error})", retryable=True) from error
        problem = check(result)
        if problem is not None:
            self._failed(worker, key)
            raise BackendError(f"worker {worker}: {problem}", retryable=True)
        self._strikes[worker] = 0
        if key is not None:
            self._failed_on.pop(key, None)
        return result

    async def aclose(self) -> None:
        for backend in self.backends:
            await backend.aclose()
