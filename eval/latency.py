"""What a method's time is made of, measured in the same run as the floor (scripts/bench_latency.py).

Why it exists: a wall-clock ratio between two methods on two shared CPU cores says neither how
close a method is to the cheapest possible reading of the document, nor whether it is slow
because it computes more (tokens) or because it waits longer (model calls one after another).
This module measures the three apart, at the backend edge, without touching the engine:

- `Recorder`: wraps a `Models` bundle's backends; every generate call is logged with its role
  (lead / subagent), start and end, prompt, cached and generated tokens; a call that raised (a
  timeout the engine retries) is logged as failed, its tokens unknown: a run with failed calls
  measured retries, not the method.
- `read_once`: the floor: every chunk's subagent prompt (ParSer's own chunking and reader, the
  question as the query) prefilled on the same backend, all chunks in flight at once as a scatter
  round sends them, one token each (`max_new_tokens=1`: the first token comes from the prefill's
  logits, so no decode forward runs).
- `Profile`: on the in-process transformers backend, where the time goes: prefill forwards, decode
  forwards (lead or subagent, whichever has calls in flight), grammar (compiling matchers, masking
  and accepting tokens) and the method's gather; the rest is Python overhead (wall minus parts).
- `MemoryWatch`: peak resident memory and prefix-cache bytes while a method runs.
- `per_length`: the calls, profile events and memory samples of one method's timed samples,
  split by sample (samples run one at a time: concurrency 1), summed per length: tokens
  prefilled and decoded, model calls, the critical path (the longest chain of calls each
  starting after the previous ended: ParSer's lead turn -> subagent round -> lead turn ...,
  MemAgent's chunks + 1), and each part of the profile.
- `write_floors` / `read_floors`: `floor.jsonl` beside the run directories, which the report's
  speedup figure draws (`eval.report.plot_latency`).

    recorder = Recorder(models)          # recorder.models runs the method; recorder.calls after
    floor = await read_once(method, recorder.models.subagent, sample)
"""
from __future__ import annotations

import asyncio
import bisect
import dataclasses
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from parser.records.metrics import PRIMARY
from parser.records.result import ResultRow
from parser.serving.backends.models import Models
from parser.serving.types import SamplingParams

FLOORS = "floor.jsonl"
PROFILE_PARTS = ("prefill", "subagent decode", "lead decode", "grammar", "gather", "Python overhead")
WATCH_EVERY_S = 0.1  # memory samples; a method's peak between two samples is missed


# ----------------------------------------------------------------------------- the call log

@dataclasses.dataclass(frozen=True)
class Call:
    role: str  # "lead" | "subagent"
    start: float  # time.time()
    end: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    failed: bool = False  # raised or was cancelled (a timeout the engine then retries): its tokens are unknown

    @property
    def prefilled(self) -> int:
        return max(0, self.prompt_tokens - self.cached_tokens)


class _Logged:
    """One role's view of a backend: `generate` logged into the recorder, everything else passed on."""

    def __init__(self, backend: Any, role: str, recorder: "Recorder", closes: bool):
        self._backend, self._role, self._recorder, self._closes = backend, role, recorder, closes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def generate(self, prompt: Any, sampling: SamplingParams, **kwargs: Any) -> Any:
        recorder = self._recorder
        start = time.time()
        recorder.in_flight[self._role] += 1
        try:
            completion = await self._backend.generate(prompt, sampling, **kwargs)
        except BaseException:  # a timed-out call still held the backend and the sample waited for it
            recorder.calls.append(Call(self._role, start, time.time(), 0, 0, 0, failed=True))
            raise
        finally:
            recorder.in_flight[self._role] -= 1
        recorder.calls.append(Call(self._role, start, time.time(), completion.prompt_tokens, completion.cached_tokens,
                                   len(completion.token_ids)))
        return completion

    async def aclose(self) -> None:
        if self._closes:  # a backend both roles share is closed once
            await self._backend.aclose()


class Recorder:
    """`Models` whose lead and subagent calls are logged (`calls`); `in_flight` counts the calls
    running per role (the profile credits a decode forward to the role that has calls running)."""

    def __init__(self, models: Models):
        self.calls: list[Call] = []
        self.in_flight = {"lead": 0, "subagent": 0}
        self.raw = models
        shared = models.subagent is None or models.subagent is models.lead
        lead = _Logged(models.lead, "lead", self, closes=True)
        subagent = _Logged(models.subagent or models.lead, "subagent", self, closes=not shared)
        self.models = Models(lead, models.lead_tokenizer, subagent, models.subagent_tokenizer or models.lead_tokenizer,
                             models.embedder)

    def clear(self) -> None:
        self.calls.clear()


def critical_path(calls: Sequence[Call]) -> int:
    """The longest chain of calls, each starting after the previous one ended: the model calls a
    sample waits for one after another (calls in flight together count once)."""
    if not calls:
        return 0
    by_end = sorted(calls, key=lambda c: c.end)
    ends = [c.end for c in by_end]
    best_upto: list[int] = []  # best chain among by_end[:i + 1]
    chain: dict[int, int] = {}
    for i, call in enumerate(by_end):
        before = bisect.bisect_right(ends, call.start) - 1
        chain[i] = 1 + (best_upto[before] if before >= 0 else 0)
        # a call ending later may still start before an earlier-ending one: best over the sorted prefix
        best_upto.append(max(chain[i], best_upto[-1] if best_upto else 0))
    return best_upto[-1]


# ----------------------------------------------------------------------------- the floor

async def read_once(method: Any, backend: Any, tokenizer: Any, sample: Any, key: str = "floor") -> dict[str, Any]:
    """Read `sample`'s document once on `backend` as ParSer's first round would, without decoding:
    every chunk (the method's own `protocol.chunk`) in its reader's prompt with the question as the
    query, all chunks in flight at once (`episode.max_concurrency` bound, as the engine's), fresh
    routing keys (`key:sample:chunk`, so nothing is reused from the method's runs), one token each.
    Returns seconds, chunks and prompt tokens."""
    chunks = method.protocol.chunk(sample.context, tokenizer)
    sampling = SamplingParams(max_new_tokens=1, temperature=0.0)
    slots = asyncio.Semaphore(method.config.max_concurrency)

    async def one(chunk: Any) -> Any:
        async with slots:
            return await backend.generate(method.reader.prompt(sample.question, chunk), sampling,
                                          routing_key=f"{key}:{sample.id}:{chunk.index}")

    started = time.perf_counter()
    done = await asyncio.gather(*(one(c) for c in chunks))
    return {"seconds": time.perf_counter() - started, "chunks": len(chunks),
            "prompt_tokens": sum(c.prompt_tokens for c in done)}


def prompt_tokens(method: Any, tokenizer: Any, sample: Any) -> list[int]:
    """Each chunk's subagent prompt length in tokens (ParSer's resident prefixes), model-free."""
    chunks = method.protocol.chunk(sample.context, tokenizer)
    return [len(tokenizer.encode(method.reader.prompt(sample.question, c), add_special_tokens=False)) for c in chunks]


def kv_bytes_per_token(backend: Any, tokenizer: Any) -> float | None:
    """The in-process backend's prefix-cache bytes per cached token, from one short prefill (the
    model's layers, heads and dtype as loaded); None for a backend without a prefix cache here."""
    if not hasattr(backend, "cache_info") or not hasattr(backend, "generate_ids"):
        return None
    ids = tokenizer.encode("The bytes one cached token holds, measured. " * 4, add_special_tokens=False)
    backend.generate_ids(ids, SamplingParams(max_new_tokens=1, temperature=0.0), key="kv-probe")
    entry = backend.cache_info().get("kv-probe")
    return entry["bytes"] / entry["tokens"] if entry and entry["tokens"] else None


def kv_refusal(length: int, prefix_tokens: Sequence[int], per_token: float | None, backend: Any,
               available: float | None) -> str | None:
    """Why ParSer's resident chunk prefixes at `length` do not fit (a bench at that length would
    measure cache thrash, or run the machine out of memory), or None. Bounds: the backend's
    `max_cache_bytes` and `max_cache_entries`, and the memory the machine has available."""
    if per_token is None:
        return None
    need = per_token * sum(prefix_tokens)
    figure = (f"{len(prefix_tokens)} chunks x {sum(prefix_tokens) / len(prefix_tokens):.0f} tokens x "
              f"{per_token / 1024:.1f} KiB/token = {need / 2**30:.2f} GiB of KV")
    if len(prefix_tokens) > backend.max_cache_entries:
        return (f"L={length}: {len(prefix_tokens)} chunk prefixes > max_cache_entries {backend.max_cache_entries} "
                f"({figure}); raise models.lead.max_cache_entries")
    if need > backend.max_cache_bytes:
        return (f"L={length}: {figure} > max_cache_bytes {backend.max_cache_bytes / 2**30:.2f} GiB; raise "
                "models.lead.max_cache_bytes")
    if available is not None and need > available:
        return f"L={length}: {figure} > the {available / 2**30:.2f} GiB this machine has available"
    return None


# ----------------------------------------------------------------------------- the profile

class _TimedMatcher:
    """A grammar matcher whose mask/accept time lands in the profile."""

    def __init__(self, matcher: Any, profile: "Profile"):
        self._matcher, self._profile = matcher, profile

    def __getattr__(self, name: str) -> Any:
        return getattr(self._matcher, name)

    def mask(self, logits: Any) -> Any:
        with self._profile.timed("grammar"):
            return self._matcher.mask(logits)

    def accept(self, token: int) -> Any:
        with self._profile.timed("grammar"):
            return self._matcher.accept(token)


class _Timer:
    def __init__(self, profile: "Profile", part: str):
        self.profile, self.part = profile, part

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        self.profile.add(self.part, time.perf_counter() - self.started)


class Profile:
    """Where an in-process transformers backend's time goes, as (time.time(), part, seconds)
    events: `_prefill` calls (prefill), the model's other forwards (decode, credited to the
    subagents while any subagent call is in flight, else the lead), matcher builds and mask /
    accept (grammar), and the method protocol's `gather`. Attached to one backend instance and
    one method instance; nothing else is changed."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self.events: list[tuple[float, str, float]] = []
        self._lock = threading.Lock()
        self._in_prefill = threading.local()
        self._forward_started: list[float] = []
        self.attached = False

    def add(self, part: str, seconds: float) -> None:
        with self._lock:
            self.events.append((time.time(), part, seconds))

    def timed(self, part: str) -> _Timer:
        return _Timer(self, part)

    def attach(self, backend: Any, method: Any = None) -> "Profile":
        """Instrument `backend` (a `TransformersBackend`; any other is left alone and the profile
        stays empty) and `method.protocol.gather` if the method has one."""
        if hasattr(backend, "_prefill") and hasattr(backend, "model"):
            prefill, matcher = backend._prefill, backend._matcher

            def timed_prefill(*args: Any, **kwargs: Any) -> Any:
                self._in_prefill.on = True
                try:
                    with self.timed("prefill"):
                        return prefill(*args, **kwargs)
                finally:
                    self._in_prefill.on = False

            def timed_matcher(sampling: Any) -> Any:
                with self.timed("grammar"):
                    built = matcher(sampling)
                return None if built is None else _TimedMatcher(built, self)

            backend._prefill, backend._matcher = timed_prefill, timed_matcher
            backend.model.register_forward_pre_hook(self._before_forward)
            backend.model.register_forward_hook(self._after_forward)
            self.attached = True
        gather = getattr(getattr(method, "protocol", None), "gather", None)  # the methods that gather findings
        if gather is not None:

            def timed_gather(*args: Any, **kwargs: Any) -> Any:
                with self.timed("gather"):
                    return gather(*args, **kwargs)

            method.protocol.gather = timed_gather
        return self

    def _before_forward(self, module: Any, args: Any) -> None:
        self._forward_started.append(time.perf_counter())

    def _after_forward(self, module: Any, args: Any, output: Any) -> None:
        seconds = time.perf_counter() - self._forward_started.pop()
        if not getattr(self._in_prefill, "on", False):
            self.add("subagent decode" if self.recorder.in_flight["subagent"] else "lead decode", seconds)


# ----------------------------------------------------------------------------- memory

def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def available_bytes() -> float | None:
    import psutil

    return float(psutil.virtual_memory().available)


class MemoryWatch:
    """Samples (time.time(), resident bytes, prefix-cache bytes) every WATCH_EVERY_S on a thread
    while a method runs (`with MemoryWatch(backend) as watch:`)."""

    def __init__(self, backend: Any = None):
        self.backend = backend
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-watch", daemon=True)

    def _cache_bytes(self) -> int:
        info = getattr(self.backend, "cache_info", None)
        return sum(e["bytes"] for e in info().values()) if info else 0

    def _run(self) -> None:
        while True:
            self.samples.append((time.time(), _rss(), self._cache_bytes()))
            if self._stop.wait(WATCH_EVERY_S):
                return

    def __enter__(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


# ----------------------------------------------------------------------------- per length

def _assign(times: Iterable[float], rows: Sequence[ResultRow]) -> list[int | None]:
    """Which sample each time belongs to: the first to finish at or after it (samples ran one at
    a time), None past the last one."""
    ends = [r.finished_at for r in rows]
    return [(i if (i := bisect.bisect_left(ends, t)) < len(ends) else None) for t in times]


# per_length's counts summed over a length's samples, then divided by their number (the means it reports)
MEAN_KEYS = ("sub_em", "prefilled", "decoded", "lead_prefilled", "subagent_prefilled", "lead_decoded", "subagent_decoded",
             "calls", "subagent_calls", "failed_calls", "critical_path", "steps", "wall_s")


def per_length(rows: Sequence[ResultRow], calls: Sequence[Call], profile: Profile | None = None,
               memory: MemoryWatch | None = None) -> dict[int, dict[str, Any]]:
    """Per length: samples, mean Sub_EM, mean per sample of tokens prefilled and decoded (in all and
    per role: lead and subagents), model calls, critical-path calls, the method's own steps and wall seconds, each
    profile part's seconds, and the peak resident and prefix-cache bytes over its samples."""
    rows = sorted((r for r in rows if r.condition is None and r.finished_at is not None), key=lambda r: r.finished_at)
    owner = _assign([c.end for c in calls], rows)
    by_sample: dict[int, list[Call]] = {i: [] for i in range(len(rows))}
    for call, i in zip(calls, owner, strict=True):
        if i is not None:
            by_sample[i].append(call)
    parts: dict[int, dict[str, float]] = {i: dict.fromkeys(PROFILE_PARTS, 0.0) for i in range(len(rows))}
    if profile is not None and profile.attached:
        events = list(profile.events)
        for (_, part, seconds), i in zip(events, _assign([e[0] for e in events], rows), strict=True):
            if i is not None:
                parts[i][part] += seconds
    peaks: dict[int, tuple[int, int]] = {}
    if memory is not None:
        for (_, rss, cache), i in zip(memory.samples, _assign([s[0] for s in memory.samples], rows), strict=True):
            if i is not None:
                old = peaks.get(i, (0, 0))
                peaks[i] = (max(old[0], rss), max(old[1], cache))
    out: dict[int, dict[str, Any]] = {}
    for i, row in enumerate(rows):
        mine = by_sample[i]
        entry = out.setdefault(row.length, {"samples": 0, **dict.fromkeys(MEAN_KEYS, 0.0),
                                            "parts": dict.fromkeys(PROFILE_PARTS, 0.0),
                                            "peak_rss": 0, "peak_cache": 0})
        entry["samples"] += 1
        entry["sub_em"] += row.scores.get(PRIMARY, 0.0)
        entry["prefilled"] += sum(c.prefilled for c in mine)
        entry["decoded"] += sum(c.output_tokens for c in mine)
        entry["lead_prefilled"] += sum(c.prefilled for c in mine if c.role == "lead")
        entry["subagent_prefilled"] += sum(c.prefilled for c in mine if c.role == "subagent")
        entry["lead_decoded"] += sum(c.output_tokens for c in mine if c.role == "lead")
        entry["subagent_decoded"] += sum(c.output_tokens for c in mine if c.role == "subagent")
        entry["calls"] += len(mine)
        entry["subagent_calls"] += sum(c.role == "subagent" and not c.failed for c in mine)
        entry["failed_calls"] += sum(c.failed for c in mine)
        entry["critical_path"] += critical_path(mine)
        entry["steps"] += row.steps
        entry["wall_s"] += row.wall_s
        measured = sum(v for k, v in parts[i].items() if k != "Python overhead")
        for part in PROFILE_PARTS:
            entry["parts"][part] += parts[i][part] if part != "Python overhead" else max(0.0, row.wall_s - measured)
        rss, cache = peaks.get(i, (0, 0))
        entry["peak_rss"], entry["peak_cache"] = max(entry["peak_rss"], rss), max(entry["peak_cache"], cache)
    for entry in out.values():
        n = entry["samples"]
        for key in MEAN_KEYS:
            entry[key] /= n
        entry["parts"] = {k: v / n for k, v in entry["parts"].items()}
    return out


def slowest_part(parts: Mapping[str, float]) -> str:
    """The profile part that holds the most time."""
    return max(parts, key=lambda k: parts[k])


# ----------------------------------------------------------------------------- floors file

def write_floors(out: Path, floors: Sequence[Mapping[str, Any]]) -> Path:
    """`floor.jsonl` in the bench's output folder: one line per (dataset, backbone, length)."""
    path = Path(out) / FLOORS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(dict(f), sort_keys=True) + "\n" for f in floors), encoding="utf-8")
    return path


def read_floors(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every `floor.jsonl` in the given folders (not below them: one bench's output folder holds
    one); a line without dataset, backbone, length and seconds is refused naming file and line."""
    floors = []
    for folder in map(Path, paths):
        path = folder / FLOORS
        if not path.is_file():
            continue
        # records end at \n only: str.splitlines would also cut at a U+2028 inside a string
        for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            if not line.strip():
                continue
            entry = json.loads(line)
            missing = [k for k in ("dataset", "backbone", "length", "seconds") if k not in entry]
            if missing:
                raise ValueError(f"{path}:{number}: a floor line needs {missing}")
            floors.append(entry)
    return floors


def machine_load() -> str:
    """One line: load averages and cores (the figures beside it are wall-clock on a shared machine)."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} cores"
