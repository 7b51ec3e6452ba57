"""A client-side worker pool: pin each chunk to one of several backends, fail over when one dies.

The production path is the sglang-router gateway (`scripts/serve_subagents.py`). Without a
gateway — the demo's multi-worker mode, a few local servers, tests — this pool gives the same
two properties: a chunk's requests go to one worker (rendezvous hashing on the routing key, so
its prefix stays in that worker's cache), and a worker that fails is skipped for `cooldown_s`
so the engine's retry of that request lands on the next worker in the key's ranking.

    pool = WorkerPool([HttpBackend(url) for url in urls])
"""
from __future__ import annotations

import hashlib
import time
from typing import Sequence

from parser.backends.base import Backend, BackendError, Completion, Prompt, SamplingParams


def _score(key: str, worker: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{worker}:{key}".encode(), digest_size=8).digest(), "big")


class WorkerPool:
    def __init__(self, backends: Sequence[Backend], cooldown_s: float = 5.0):
        if not backends:
            raise ValueError("WorkerPool needs at least one backend")
        self.backends = list(backends)
        self.cooldown_s = cooldown_s
        self._down_until = [0.0] * len(self.backends)
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
        return next((w for w in ranking if self._down_until[w] <= now), ranking[0])

    async def generate(
        self, prompt: Prompt, sampling: SamplingParams, *, routing_key: str | None = None, request_id: str | None = None
    ) -> Completion:
        worker = self.pick(routing_key or request_id)
        try:
            return await self.backends[worker].generate(prompt, sampling, routing_key=routing_key, request_id=request_id)
        except BackendError as error:
            if error.retryable:
                self._down_until[worker] = time.monotonic() + self.cooldown_s
            raise

    async def aclose(self) -> None:
        for backend in self.backends:
            await backend.aclose()
