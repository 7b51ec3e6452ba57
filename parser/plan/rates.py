"""A server's measured speed, as a cost model for one batch of requests.

Why it exists: the planner predicts from measurements, not guesses. `parser plan
calibrate` times real request bursts on a backend and fits the coefficients below by
non-negative least squares; paper-scale rates may instead be entered from published figures,
with `source` saying which. One file per (model, hardware, server) — a worker, not a cluster.

The cost of one batch of n requests, request i prefilling p_i new tokens after c_i cached ones
and then decoding d_i tokens (decode step k runs the a_k requests still generating):

    t = n * overhead_s
      + sum_i p_i * prefill_s_per_token + sum_i p_i * (c_i + p_i / 2) * prefill_s_per_token_ctx
      + sum_k (decode_step_s + a_k * decode_s_per_seq) + sum_i d_i * (c_i + p_i) * decode_s_per_seq_ctx

`decode_step_s` is what batching amortises (a GPU's weight reads per step); `decode_s_per_seq`
what it does not. A server that serialises requests (the CPU `parser.serving.server`, whose backend runs
one request at a time under a lock) has `max_batch: 1` and its cost is the sum of singles.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import yaml

COEFFICIENTS = ("overhead_s", "prefill_s_per_token", "prefill_s_per_token_ctx", "decode_step_s", "decode_s_per_seq",
                "decode_s_per_seq_ctx")


@dataclasses.dataclass(frozen=True)
class Job:
    """One request as the cost model sees it."""

    new_tokens: int  # prefilled now
    cached_tokens: int  # reused from the cache
    output_tokens: int


@dataclasses.dataclass(frozen=True)
class Rates:
    overhead_s: float = 0.0
    prefill_s_per_token: float = 0.0
    prefill_s_per_token_ctx: float = 0.0
    decode_step_s: float = 0.0
    decode_s_per_seq: float = 0.0
    decode_s_per_seq_ctx: float = 0.0
    max_batch: int = 1  # requests the server runs together
    source: str = ""  # where the numbers come from (a calibration run, a paper, a benchmark)

    def batch_seconds(self, jobs: Sequence[Job]) -> float:
        return float(np.dot(features(jobs), self.vector()))

    def vector(self) -> np.ndarray:
        return np.array([getattr(self, name) for name in COEFFICIENTS])

    # ------------------------------------------------------------ derived figures for tables
    def prefill_tokens_per_s(self, batch: int, prompt_tokens: int) -> float:
        jobs = [Job(prompt_tokens, 0, 1)] * batch
        return batch * prompt_tokens / self.makespan(jobs)

    def decode_tokens_per_s(self, batch: int, context_tokens: int, output_tokens: int = 64) -> float:
        jobs = [Job(1, context_tokens, output_tokens)] * batch
        return batch * output_tokens / (self.makespan(jobs) - self.makespan([Job(1, context_tokens, 1)] * batch))

    def makespan(self, jobs: Sequence[Job]) -> float:
        """Time to serve `jobs` arriving together: FIFO batches of at most `max_batch`."""
        return sum(self.batch_seconds(jobs[i:i + self.max_batch]) for i in range(0, len(jobs), self.max_batch))

    # ------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Rates":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names - {"measurements", "fit", "derived"}
        if unknown:
            raise ValueError(f"rates: unknown keys {sorted(unknown)}; expected {sorted(names)}")
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def load(cls, path: str | Path) -> "Rates":
        return cls.from_dict(yaml.safe_load(Path(path).read_text(encoding="utf-8")))


def features(jobs: Sequence[Job]) -> np.ndarray:
    """The batch's cost features, in `COEFFICIENTS` order."""
    out = np.zeros(len(COEFFICIENTS))
    if not jobs:
        return out
    out[0] = len(jobs)
    for job in jobs:
        out[1] += job.new_tokens
        out[2] += job.new_tokens * (job.cached_tokens + job.new_tokens / 2)
        out[5] += job.output_tokens * (job.cached_tokens + job.new_tokens)
    outputs = sorted(job.output_tokens for job in jobs)
    steps = outputs[-1]
    out[3] = steps
    out[4] = sum(outputs)  # sum_k a_k: each request is active for its own d_i steps
    return out


def makespan_features(jobs: Sequence[Job], max_batch: int) -> np.ndarray:
    return sum((features(jobs[i:i + max_batch]) for i in range(0, len(jobs), max_batch)), np.zeros(len(COEFFICIENTS)))


def fit(samples: Sequence[tuple[Sequence[Job], float]], max_batch: int, *, source: str,
        fixed_zero: Sequence[str] = ()) -> tuple[Rates, dict[str, float]]:
    """Non-negative least squares on relative error: each measured makespan weighs the same.

    Robust to a shared machine: after a first fit, samples whose relative residual lies more
    than 3 scaled median absolute deviations from the median (a burst that met another
    process's spike) are dropped and the fit is redone once. Returns the rates and fit
    statistics (max and mean relative error on the kept samples, how many were dropped)."""
    X = np.array([makespan_features(jobs, max_batch) for jobs, _ in samples])
    y = np.array([seconds for _, seconds in samples])
    keep_cols = [i for i, name in enumerate(COEFFICIENTS) if name not in fixed_zero]

    def solve(rows: np.ndarray) -> np.ndarray:
        coef = np.zeros(len(COEFFICIENTS))
        coef[keep_cols] = nnls(X[rows][:, keep_cols] / y[rows, None], np.ones(int(rows.sum())))
        return coef

    rows = np.ones(len(y), dtype=bool)
    coef = solve(rows)
    rel = (X @ coef - y) / y
    spread = max(1.4826 * float(np.median(np.abs(rel - np.median(rel)))), 0.05)
    rows = np.abs(rel - np.median(rel)) <= 3 * spread
    if rows.sum() >= len(keep_cols) and not rows.all():
        coef = solve(rows)
    rel = np.abs(X @ coef - y)[rows] / y[rows]
    rates = Rates(**dict(zip(COEFFICIENTS, map(float, coef), strict=True)), max_batch=max_batch, source=source)
    return rates, {"max_rel_error": float(rel.max()), "mean_rel_error": float(rel.mean()), "samples": int(rows.sum()),
                   "dropped": int((~rows).sum())}


def nnls(A: np.ndarray, b: np.ndarray, iterations: int = 200) -> np.ndarray:
    """min ||Ax - b|| subject to x >= 0 (Lawson-Hanson active set), on column-scaled A."""
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    A = A / scale
    n = A.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(iterations):
        w = A.T @ (b - A @ x)
        if passive.all() or w[~passive].max(initial=-np.inf) <= 1e-12:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            bad = passive & (z <= 0)
            alpha = np.min(x[bad] / (x[bad] - z[bad]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
    return x / scale
