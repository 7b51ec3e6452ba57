"""Measure a backend's prefill and decode speed vs batch and fit `parser.plan.rates.Rates`.

Why it exists: the planner's predictions are only as good as its rates, so they are measured
on the server that will run the subagents: bursts of requests with chosen prompt lengths, cached
prefixes and output lengths, `batch` requests per worker at once on every worker at the same
time (a scatter round loads all workers together, so contention between them is measured, not
assumed). Token counts come from the server's own replies (`prompt_tokens`, `cached_tokens`,
output ids), never from what was asked for.

    parser plan calibrate                            # 2 CPU parser.serving.server workers, tiny-qwen3.5
    parser plan calibrate calibrate.model=smollm2 calibrate.workers=3
    parser plan calibrate 'calibrate.urls=[http://gpu1:30000]' calibrate.max_batch=256  # a running server

The rates file (YAML) holds the coefficients, every measurement and the fit's error.
"""
from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from pathlib import Path
from typing import Any, Sequence

import yaml

from parser.base.redact import redact
from parser.serving.types import SamplingParams
from parser.serving.backends.http import HttpBackend
from parser.plan.rates import Job, Rates, fit


@dataclasses.dataclass(frozen=True)
class Probe:
    """One timed burst: `batch` requests per worker, each `new` fresh tokens after a `cached`-token
    prefix warmed beforehand (0: cold), generating up to `output` tokens."""

    batch: int
    new: int
    cached: int
    output: int


def default_probes(batches: Sequence[int], lengths: Sequence[int], outputs: Sequence[int]) -> list[Probe]:
    """Cold prefills at each length, prefix hits (short suffix after each length), and decodes
    at short and long context; each at every batch size."""
    shapes = [(n, 0, 1) for n in lengths]
    shapes += [(16, n, 1) for n in lengths[1:]]
    shapes += [(16, 0, d) for d in outputs] + [(16, lengths[-1], d) for d in outputs[-1:]]
    return [Probe(b, *shape) for b in batches for shape in shapes]


class Calibrator:
    """Times probes against `urls` (one server per worker); `fit_rows` turns the rows into rates."""

    def __init__(self, urls: Sequence[str], tokenizer: Any, *, api: str = "sglang", seed: int = 0,
                 timeout_s: float = 600.0):
        self.backends = [HttpBackend(url, api=api, timeout_s=timeout_s) for url in urls]  # type: ignore[arg-type]
        self.tokenizer = tokenizer
        self.vocab = vocabulary(tokenizer)
        self.rng = random.Random(seed)
        self.serial = 0

    def _ids(self, n: int) -> list[int]:
        return [self.rng.choice(self.vocab) for _ in range(n)]

    async def _one(self, backend: HttpBackend, ids: list[int], output: int, key: str) -> tuple[Job, float]:
        # text, as the reader sends it: the server's tokenization is part of each request's cost
        text = self.tokenizer.decode(ids)
        sampling = SamplingParams(max_new_tokens=output, temperature=1.0, seed=self.rng.randrange(1 << 30))
        c = await backend.generate(text, sampling, routing_key=key)
        prompt = c.prompt_tokens or len(ids)
        return Job(prompt - c.cached_tokens, c.cached_tokens, max(len(c.token_ids), 1)), time.perf_counter()

    async def measure(self, probe: Probe) -> list[tuple[list[Job], float]]:
        """One burst; one (jobs, makespan) sample per worker."""
        prompts = []
        for w in range(len(self.backends)):
            for _ in range(probe.batch):
                self.serial += 1
                prompts.append((w, f"calibrate:{self.serial}", self._ids(probe.cached), self._ids(probe.new)))
        if probe.cached:  # warm each prefix on its worker (untimed)
            await asyncio.gather(*(self._one(self.backends[w], prefix, 1, key) for w, key, prefix, _ in prompts))
        started = time.perf_counter()
        done = await asyncio.gather(*(self._one(self.backends[w], prefix + fresh, probe.output, key)
                                      for w, key, prefix, fresh in prompts))
        samples = []
        for w in range(len(self.backends)):
            mine = [d for (owner, *_), d in zip(prompts, done, strict=True) if owner == w]
            samples.append(([job for job, _ in mine], max(t for _, t in mine) - started))
        return samples

    async def run(self, probes: Sequence[Probe], repeats: int) -> list[dict[str, Any]]:
        await self.measure(Probe(1, 8, 0, 2))  # first requests pay lazy initialisation: not measured
        rows = []
        for _ in range(repeats):
            for probe in probes:
                for jobs, seconds in await self.measure(probe):
                    rows.append({"probe": dataclasses.asdict(probe), "seconds": seconds,
                                 "jobs": [dataclasses.astuple(j) for j in jobs]})
        return rows

    async def aclose(self) -> None:
        for backend in self.backends:
            await backend.aclose()


def fit_rows(rows: Sequence[dict[str, Any]], max_batch: int, source: str) -> tuple[Rates, dict[str, float]]:
    samples = [([Job(*j) for j in row["jobs"]], row["seconds"]) for row in rows]
    return fit(samples, max_batch, source=source)


def derived_table(rates: Rates, batches: Sequence[int], prompt_tokens: int) -> list[dict[str, float]]:
    """Prefill and decode tokens/s per worker at each batch size (what the fit implies)."""
    return [{"batch": b, "prefill_tokens_per_s": round(rates.prefill_tokens_per_s(b, prompt_tokens), 1),
             "decode_tokens_per_s": round(rates.decode_tokens_per_s(b, prompt_tokens), 1)} for b in batches]


def write_rates(path: str | Path, rates: Rates, stats: dict[str, float], rows: Sequence[dict[str, Any]],
                table: Sequence[dict[str, float]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {**rates.to_dict(), "fit": stats, "derived": list(table), "measurements": list(rows)}
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=120), encoding="utf-8")
    return path


def vocabulary(tokenizer: Any) -> list[int]:
    """Ordinary token ids to build prompts from (no special tokens)."""
    special = set(tokenizer.all_special_ids)
    return [i for i in range(min(len(tokenizer), 50_000)) if i not in special][:8000]


class LocalWorkers:
    """`num` local `parser serve` processes on 127.0.0.1 (started and stopped by us,
    by PID), each limited to `threads` torch threads so that workers do not fight over cores."""

    def __init__(self, model: str, num: int, threads: int, log_dir: str | Path):
        from parser.serving.gateway import ProcessGroup, worker_launches

        self.launches = worker_launches({"_target_": "parser.serving.gateway.parser_serve_worker", "num": num, "cpu_model": model,
                                         "env": {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}})
        self.group = ProcessGroup(log_dir)

    @property
    def urls(self) -> list[str]:
        return [launch.url for launch in self.launches]

    def __enter__(self) -> "LocalWorkers":
        try:
            for launch in self.launches:
                self.group.start(launch)
            for launch in self.launches:
                self.group.wait_ready(launch, timeout_s=300)
        except BaseException:
            self.group.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.group.stop()


def main(cfg: dict[str, Any], out_dir: Path) -> Rates:
    """`parser plan calibrate`: local workers (or `urls`), probes, fit, rates file."""
    from contextlib import nullcontext

    from parser.serving.backends import load_tokenizer

    c = cfg["calibrate"]
    tokenizer = load_tokenizer(c["tokenizer"] or c["model"])
    local = LocalWorkers(c["model"], c["workers"], c["threads_per_worker"], out_dir / "workers") if not c["urls"] else None

    async def measure(urls: Sequence[str]) -> list[dict[str, Any]]:
        calibrator = Calibrator(urls, tokenizer, api=c["api"], seed=c["seed"])
        try:
            return await calibrator.run(default_probes(c["batches"], c["lengths"], c["outputs"]), c["repeats"])
        finally:
            await calibrator.aclose()

    with local or nullcontext():
        urls = local.urls if local else list(c["urls"])
        rows = asyncio.run(measure(urls))
    where = f"{len(urls)} local parser.serving.server workers ({c['model']}, {c['threads_per_worker']} thread(s) each)" \
        if local else redact(", ".join(urls))  # the rates file names its source: never a password
    rates, stats = fit_rows(rows, c["max_batch"], source=f"parser plan calibrate on {where}")
    table = derived_table(rates, c["batches"], c["lengths"][-1])
    path = write_rates(Path(c["output"]) if c["output"] else out_dir / "rates.yaml", rates, stats, rows, table)
    print(f"fit over {stats['samples']} bursts ({stats['dropped']} dropped): mean rel. error "
          f"{stats['mean_rel_error']:.0%}, max {stats['max_rel_error']:.0%}")
    for row in table:
        print(f"  batch {row['batch']}: prefill {row['prefill_tokens_per_s']} tok/s, decode "
              f"{row['decode_tokens_per_s']} tok/s per worker (prompt {c['lengths'][-1]} tokens)")
    print(f"wrote {path}")
    return rates
