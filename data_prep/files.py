"""Atomic file writes, dataset cards and resumable JSONL logs.

An interrupted run must never leave a truncated file that looks complete: every output is
written to a temporary file beside its target and `os.replace`d into place (atomic on POSIX),
and the dataset card is written last, so a card next to a file means the file is whole.
The one exception is the append-only JSONL log of resumable jobs (the parametric filter),
which repairs a torn last line on reopen instead.
"""
from __future__ import annotations

import contextlib
import datetime
import glob
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

import orjson

from data_prep.records import DataError


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


class JsonlLog:
    """Append-only JSONL keyed by an id field, for jobs that resume after an interruption.

    On open, a torn last line (the process died mid-write) is cut off so appends stay valid.
    """

    def __init__(self, path: str | os.PathLike, key: str = "id"):
        self.path = Path(path)
        self.key = key
        self.rows: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            self._load()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "ab")

    def _load(self) -> None:
        data = self.path.read_bytes()
        good = 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                break
            self.rows[str(row[self.key])] = row
            good += len(line)
        if good != len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good)

    def __contains__(self, key: str) -> bool:
        return str(key) in self.rows

    def append(self, row: dict[str, Any]) -> None:
        self._f.write(orjson.dumps(row) + b"\n")
        self._f.flush()
        self.rows[str(row[self.key])] = row

    def close(self) -> None:
        self._f.close()


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
