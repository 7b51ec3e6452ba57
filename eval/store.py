"""The results store: one JSONL row per finished sample, safe to kill and resume.

A long evaluation (8 lengths x 128 questions x 3 runs, hours at 896K tokens) will be
interrupted. Every finished sample is appended as one line and fsync'd before the next one is
counted, so a crash loses at most the samples in flight. A row is keyed by
(dataset, length, condition, run, sample id); re-running the same command reads the keys back
and skips them, so samples are never duplicated or lost (`eval.inputs` checks that the rows
were computed on the same inputs). Each file follows `parser.records.jsonl.JsonlStore`'s rules: a
line torn by a kill mid-write is cut on load, a failed append leaves no fragment, and a bad
line is skipped and named by file and line, so the directory always reopens.

Per-subset wall times live in a second file (`timings.jsonl`), one line per (subset, session),
so amortized latency (subset wall time / samples finished in it) survives resumes. A session
killed mid-subset writes no line; its rows carry `session` and `finished_at`, from which the
report times them instead (`eval.report.latency_table`).

One process owns a run directory at a time: `lock_run_dir` holds an exclusive `flock` on
`.eval.lock` (released by the kernel when the process exits, however it dies), and a second
`eval.run` on the same `out_dir` stops with `RunDirLocked` instead of writing rows twice.

    with lock_run_dir(run_dir):
        store = ResultsStore(run_dir)
        done = store.done_keys()
        store.append(row)        # a parser.records.result.ResultRow, keyed by row.key
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Any, Iterator

from parser.records.jsonl import JsonlStore
from parser.records.result import Key, ResultRow, TimingLine

RESULTS = "results.jsonl"
TIMINGS = "timings.jsonl"
ERRORS = "errors.jsonl"
LOCK = ".eval.lock"


class RunDirLocked(RuntimeError):
    """This process cannot hold the run directory: another process is evaluating into it, or it
    cannot be made or written (a file is in the way, no permission)."""


def make_run_dir(run_dir: str | Path) -> Path:
    """`run_dir`, made if it is not there; one that cannot be (a file in the way, a folder under a
    file, no permission) is `RunDirLocked` in one line, not a traceback (the commands check the
    folder before Hydra makes it: `parser.base.settings.check_run_folder`)."""
    path = Path(run_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        what = "a file, not a directory" if path.is_file() else error.strerror or str(error)
        raise RunDirLocked(f"out_dir {path}: cannot be used as a run directory ({what})") from None
    return path


@contextlib.contextmanager
def lock_run_dir(run_dir: str | Path) -> Iterator[None]:
    """Hold `run_dir` exclusively for the block; refuse at once if another process holds it."""
    path = make_run_dir(run_dir)
    try:
        handle = open(path / LOCK, "a+", encoding="utf-8")
    except OSError as error:
        raise RunDirLocked(f"out_dir {path}: cannot be used as a run directory ({error.strerror or error})") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise RunDirLocked(f"{path} is in use by another eval.run ({holder}); wait for it to finish, "
                               "or give this run its own out_dir") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, since {time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_jsonl(path: Path, repair: bool = False) -> Iterator[dict[str, Any]]:
    """The complete rows of one of a run's JSONL files as JSON objects, by the store's rules
    (`parser.records.jsonl.JsonlStore`); `repair=False` leaves the file as it is."""
    yield from JsonlStore(path, readonly=not repair).rows


def read_results(run_dir: str | Path) -> list[ResultRow]:
    """A run directory's result rows, typed; a line that is not one is skipped and named."""
    return JsonlStore(Path(run_dir) / RESULTS, readonly=True, row_type=ResultRow).rows


def read_timings(run_dir: str | Path) -> list[TimingLine]:
    return JsonlStore(Path(run_dir) / TIMINGS, readonly=True, row_type=TimingLine).rows


def _key(row: ResultRow) -> Key:
    return row.key


class ResultsStore:
    """A run directory's JSONL files, each a `parser.records.jsonl.JsonlStore` (one set of rules: a
    failed append loses no acknowledged row and leaves no fragment, the store always reopens,
    and what it skips it names by file and line); safe for concurrent coroutines/threads."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.results_path = self.run_dir / RESULTS
        self.results = JsonlStore(self.results_path, key=_key, row_type=ResultRow)
        self.timings = JsonlStore(self.run_dir / TIMINGS, row_type=TimingLine)
        self.errors = JsonlStore(self.run_dir / ERRORS)

    @property
    def problems(self) -> list[str]:
        """What opening skipped or repaired, by file and line."""
        return self.results.problems + self.timings.problems + self.errors.problems

    def done_keys(self) -> set[Key]:
        return set(self.results.by_key)

    def rows(self) -> list[ResultRow]:
        return list(self.results.rows)

    def append(self, row: ResultRow) -> bool:
        """Write one finished sample; returns False (and writes nothing) if its key is done."""
        return self.results.append(row)

    def log_timing(self, entry: TimingLine) -> None:
        self.timings.append(entry)

    def log_error(self, entry: dict[str, Any]) -> None:
        self.errors.append(entry)
