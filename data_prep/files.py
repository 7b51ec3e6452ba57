"""Atomic file writes, dataset cards and resumable JSONL logs.

An interrupted run must never leave a truncated file that looks complete: every output is
written to a temporary file beside its target and `os.replace`d into place (atomic on POSIX),
and the dataset card is written last, so a card next to a file means the file is whole.
The one exception is the append-only JSONL store of resumable jobs (`JsonlStore`: the eval
results store, the parametric filter's log), which has its own rules for failed and torn writes.
"""
from __future__ import annotations

import contextlib
import datetime
import glob
import json
import logging
import os
import platform
import statistics
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Iterator

import orjson

from data_prep.records import DataError

log = logging.getLogger(__name__)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success it replaces `path`, on error it is removed.

    The temp name carries the writer's pid (`.{name}.{pid}.{random}.tmp`). A killed build (SIGKILL,
    OOM) cannot remove its temp file, so each write first removes the temps beside its target
    whose writer is gone; a live writer's temp is left alone.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; outputs get the usual permissions
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def remove_stale_temps(target: Path) -> list[Path]:
    """Delete `.{target.name}.*.tmp` files left by writers that no longer run; return them."""
    removed = []
    for tmp in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
        pid = tmp.name[len(target.name) + 2 :].split(".", 1)[0]
        if pid.isdigit() and _alive(int(pid)):
            continue  # a live writer's (older temps without a pid are stale by construction)
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
            removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def write_json(path: str | os.PathLike, obj: Any, indent: bool = False) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2 if indent else 0))
    return Path(path)


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict[str, Any]]) -> Path:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        for row in rows:
            f.write(orjson.dumps(row))
            f.write(b"\n")
    return Path(path)


def write_records(path: str | os.PathLike, rows: list[dict[str, Any]]) -> Path:
    """Eval rows: a JSON list for ``*.json`` (MemAgent's `eval_{L}.json`), JSONL otherwise."""
    return write_json(path, rows) if str(path).endswith(".json") else write_jsonl(path, rows)


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a JSON list or JSONL file; errors name the file and line."""
    path = Path(path)
    data = path.read_bytes()
    if path.suffix == ".json" or data.lstrip()[:1] == b"[":
        try:
            rows = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(rows, list):
            raise DataError(f"{path}: expected a JSON list of records, got {type(rows).__name__}")
        return rows
    rows = []
    for lineno, line in enumerate(data.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(orjson.loads(line))
            except orjson.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e})") from None
    return rows


class JsonlStore:
    """One append-only JSONL file of rows, with one set of rules for every resumable job (the
    eval results store, the knowledge filter's log):

    * A row is acknowledged when `append` returns: its whole line, newline included, was written
      and fsync'd right after the last complete line.
    * A failed append (disk full, file-size limit, I/O error) raises and leaves the file as it was:
      the partial line is cut off, and if even that fails the next append overwrites it and cuts
      after itself. (Appending in "a" mode fused the next row onto the fragment.)
    * Opening never fails on content. A last line without its newline that parses is a complete
      row (the newline is added); one that does not is a write that never finished (never
      acknowledged) and is cut off. A bad line elsewhere — not JSON, not an object, no key — is
      left in the file, skipped and reported by file and line (`problems`, and a warning); a line
      where an unfinished write was fused with a complete row gives the row back.
    * With `key`, the first row of a key wins (`append` refuses a key already there); later
      duplicates in the file are reported.

    One writer at a time (eval.run holds `lock_run_dir`); `readonly=True` reads without repairing.

        log = JsonlStore("filter.jsonl", key=lambda row: str(row["id"]))
        if "q7" not in log:
            log.append({"id": "q7", ...})
    """

    def __init__(self, path: str | os.PathLike, key: Callable[[dict[str, Any]], Hashable] | None = None, *,
                 readonly: bool = False):
        self.path, self.key, self.readonly = Path(path), key, readonly
        self.rows: list[dict[str, Any]] = []
        self.by_key: dict[Hashable, dict[str, Any]] = {}
        self.problems: list[str] = []
        self._end = 0  # offset just past the last complete line: where the next row goes
        self._lock = threading.Lock()
        if self.path.exists():
            self._load()
        for problem in self.problems:
            log.warning("%s", problem)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.by_key

    def __len__(self) -> int:
        return len(self.rows)

    def _load(self) -> None:
        data = self.path.read_bytes()
        start, lineno = 0, 0
        while start < len(data):
            lineno += 1
            newline = data.find(b"\n", start)
            if newline < 0:  # the last line has no newline: complete, or a write that never finished
                row = self._parse(data[start:], lineno, report=False)
                if row is not None:
                    self._accept(row, lineno)
                    self._end = len(data) + 1
                    self._repair(lambda f: (f.seek(len(data)), f.write(b"\n")))
                else:
                    self.problems.append(f"{self.path}:{lineno}: an unfinished last line (the writer stopped mid-row) "
                                         f"was {'left' if self.readonly else 'cut off'}; it was never acknowledged")
                    self._end = start
                    self._repair(lambda f: f.truncate(start))
                return
            row = self._parse(data[start:newline], lineno, report=True)
            if row is not None:
                self._accept(row, lineno)
            start = self._end = newline + 1

    def _repair(self, fix: Callable[[Any], Any]) -> None:
        if self.readonly:
            return
        with open(self.path, "r+b") as f:
            fix(f)
            f.flush()
            os.fsync(f.fileno())

    def _parse(self, line: bytes, lineno: int, report: bool) -> dict[str, Any] | None:
        if not line.strip():
            return None
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            fused = _fused_row(line)
            if fused is not None:
                self.problems.append(f"{self.path}:{lineno}: an unfinished write was fused with the row after it; "
                                     "the row is read, the fragment skipped")
                return fused
            if report:
                self.problems.append(f"{self.path}:{lineno}: not a JSON row ({error}); skipped, left in the file")
            return None
        if not isinstance(row, dict):
            if report:
                self.problems.append(f"{self.path}:{lineno}: a JSON {type(row).__name__}, not a row; skipped, left in the file")
            return None
        return row

    def _accept(self, row: dict[str, Any], lineno: int) -> None:
        if self.key is not None:
            try:
                key = self.key(row)
            except (KeyError, TypeError, ValueError) as error:
                self.problems.append(f"{self.path}:{lineno}: a row without its key ({error}); skipped, left in the file")
                return
            if key in self.by_key:
                self.problems.append(f"{self.path}:{lineno}: key {key!r} again; the first row is kept")
                return
            self.by_key[key] = row
        self.rows.append(row)

    def append(self, row: dict[str, Any]) -> bool:
        """Write one row and fsync it; False (nothing written) if its key is already there.
        Raises OSError if the write fails; the file and the rows before stay as they were."""
        if self.readonly:
            raise ValueError(f"{self.path}: opened read-only")
        line = (json.dumps(row, ensure_ascii=False, default=str) + "\n").encode("utf-8")
        with self._lock:
            key = self.key(row) if self.key is not None else None
            if self.key is not None and key in self.by_key:
                return False
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o666)
            try:
                try:
                    os.lseek(fd, self._end, os.SEEK_SET)
                    view = memoryview(line)
                    while view:
                        view = view[os.write(fd, view):]
                    os.ftruncate(fd, self._end + len(line))  # what an earlier failed append left beyond
                    os.fsync(fd)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, self._end)
                    raise
            finally:
                os.close(fd)
            self._end += len(line)
            if self.key is not None:
                self.by_key[key] = row
            self.rows.append(row)
            return True


def _fused_row(line: bytes) -> dict[str, Any] | None:
    """The complete row at the end of a line that starts with an unfinished write's fragment:
    the longest suffix starting at `{"` that parses as an object."""
    position = line.find(b'{"', 1)
    while position > 0:
        try:
            row = json.loads(line[position:])
        except (json.JSONDecodeError, UnicodeDecodeError):
            position = line.find(b'{"', position + 1)
            continue
        return row if isinstance(row, dict) else None
    return None


def token_stats(counts: list[int]) -> dict[str, float]:
    if not counts:
        return {}
    return {"min": min(counts), "max": max(counts), "mean": round(statistics.fmean(counts), 1),
            "median": statistics.median(counts), "total": sum(counts)}


def _git_revision() -> str | None:
    """The repository commit that produced the data (None outside a git checkout)."""
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def write_card(data_path: str | os.PathLike, *, recipe: str, config: dict[str, Any], counts: dict[str, Any],
               token_counts: list[int] | None = None, tokenizer: str | None = None,
               source: dict[str, Any] | None = None) -> Path:
    """Write ``<data_path>.card.json``: recipe, seeds/config, source revision, counts, token stats."""
    card = {
        "file": Path(data_path).name,
        "bytes": Path(data_path).stat().st_size,
        "recipe": recipe,
        "config": config,
        "source": source or {},
        "counts": counts,
        "tokens": {"tokenizer": tokenizer, **token_stats(token_counts or [])} if token_counts else None,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "code_revision": _git_revision(),
    }
    return write_json(f"{data_path}.card.json", json.loads(json.dumps(card, default=str)), indent=True)
