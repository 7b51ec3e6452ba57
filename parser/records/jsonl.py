"""JSON files that survive interruptions and hand edits: atomic writes, strict reads, the
append-only JSONL store of resumable jobs.

Why here, in the library: eval's results store, data prep's writers and the knowledge filter's
log all keep their rows this way, so the rules live once, below both `eval/` and `data_prep/`.

* An interrupted write never leaves a truncated file that looks complete: every output goes to
  a temp file beside its target, is fsync'd, `os.replace`d into place (atomic on POSIX), and the
  directory is fsync'd so the rename itself survives a power cut (`atomic_path`).
* A line read back is the JSON this project writes, or it is refused with the file, line and
  field named (`parse_json`): no `Infinity`/`NaN`/`1e400` (a reward or mean it reached would
  become NaN), no number beyond a double, nothing nested deeper than `MAX_DEPTH`, only UTF-8. A
  lone surrogate (`"\\ud800"`) is read back as U+FFFD, so no later writer fails on it.
* `JsonlStore` is the append-only file of a resumable job (eval's results, the filter's log),
  with its own rules for failed and torn writes (its docstring).

    rows = read_records("data/eval/hotpotqa/eval_200.json")     # DataError names file and line
    with atomic_path("out/table.csv") as tmp:
        tmp.write_text(text)
    log = JsonlStore("filter.jsonl", key=lambda row: str(row["id"]))
"""
from __future__ import annotations

import contextlib
import glob
import json
import logging
import math
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Iterator

import orjson

from parser.records.sample import DataError

log = logging.getLogger(__name__)

MAX_DEPTH = 64  # nesting a row may have; the deepest this project writes (a trajectory) is under 10
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # what the standard parser lets through from an escape
_UTF8_ERRORS = "backslashreplace"  # a lone surrogate is written as its JSON escape `\udXXX`


class BadJson(ValueError):
    """A JSON text this project refuses to read; the message names the field.

    `complete` is False when the text simply stops (a write cut short), True when it is whole
    JSON (or bytes no write of ours produced). `refused` is True when the text is whole JSON whose
    value is refused (a number, a depth): it cannot be a torn write fused with a row."""

    def __init__(self, message: str, complete: bool, refused: bool = False):
        super().__init__(message)
        self.complete, self.refused = complete, refused


class _Refused:
    """A value `json.loads` parsed that a row may not hold; `parse_json` names its field."""

    def __init__(self, what: str):
        self.what = what


def _float(text: str) -> float | _Refused:
    value = float(text)
    return value if math.isfinite(value) else _Refused(f"{text[:20]}{'...' if len(text) > 20 else ''} (beyond a double)")


def _int(text: str) -> int | float | _Refused:
    if len(text.lstrip("-")) <= 20:  # every 64-bit integer, read exactly as orjson reads it
        return int(text)
    value = float(text)  # as orjson reads it: past 64 bits an integer is a double
    return value if math.isfinite(value) else _Refused(f"an integer of {len(text.lstrip('-'))} digits (beyond a double)")


def _constant(name: str) -> _Refused:
    return _Refused(f"{name} (not JSON; write a number or null)")


def parse_json(data: bytes) -> Any:
    """One JSON text as this project writes it, or `BadJson` naming the field and why.

    orjson reads the well-formed text; whatever it refuses is read again by the standard parser
    with hooks, only to say which field is wrong (or to read a lone surrogate's escape)."""
    try:
        value = orjson.loads(data)
    except (orjson.JSONDecodeError, RecursionError):
        return _diagnose(data)
    if isinstance(value, (dict, list)) and not _within_depth(value):
        _check(value, replace=False)  # raises, naming the field
    return value


def _within_depth(value: dict | list) -> bool:
    """Whether no container nests deeper than `MAX_DEPTH` (containers only: the fast check)."""
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return False
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return True


def _diagnose(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        cut = error.end >= len(data) and error.reason == "unexpected end of data"
        raise BadJson(f"byte {error.start} is not UTF-8 ({error.reason}); save the file as UTF-8", complete=not cut) from None
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except RecursionError:
        raise BadJson(f"nested more than {MAX_DEPTH} levels deep", complete=True) from None
    except json.JSONDecodeError as error:  # on a last line: a write cut short, as far as anyone can tell
        raise BadJson(f"not JSON ({error.msg} at column {error.colno})", complete=False) from None
    return _check(value, replace=True)


def _check(value: Any, replace: bool) -> Any:
    """Walk containers without recursion: refuse a `_Refused` or too deep a nesting, naming the
    field; with `replace`, lone surrogates in strings become U+FFFD."""
    root = [value]
    stack: list[tuple[Any, str, int]] = [(root, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BadJson(f"field {path or '(top level)'!r} is nested more than {MAX_DEPTH} levels deep", complete=True,
                          refused=True)
        items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        for key, item in items:
            where = path if node is root else (f"{path}[{key}]" if isinstance(node, list) else f"{path}.{key}" if path else str(key))
            if isinstance(item, (dict, list)):
                stack.append((item, where, depth + 1))
            elif isinstance(item, _Refused):
                raise BadJson(f"field {where or '(top level)'!r} is {item.what}", complete=True, refused=True)
            elif replace and isinstance(item, str) and not item.isascii():
                node[key] = _LONE_SURROGATE.sub("\ufffd", item)
            if replace and isinstance(node, dict) and not key.isascii():
                clean = _LONE_SURROGATE.sub("\ufffd", key)
                if clean != key:
                    node[clean] = node.pop(key)
    return root[0]


def dumps_line(row: dict[str, Any]) -> bytes:
    """One JSONL line (newline included); a lone surrogate is written as its escape, never fatal."""
    return (json.dumps(row, ensure_ascii=False, default=str, allow_nan=False) + "\n").encode("utf-8", _UTF8_ERRORS)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or a new file in `path` durable (the directory entry is data too)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success it is fsync'd and replaces `path` (the
    directory fsync'd after), on error it is removed.

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
        _fsync_file(tmp)
        os.replace(tmp, target)
        fsync_dir(target.parent)
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


def write_json(path: str | os.PathLike, obj: Any, indent: bool = False,
               default: Callable[[Any], Any] | None = None) -> Path:
    """Write one JSON document atomically; `default` turns what orjson cannot write into what it can."""
    option = orjson.OPT_NON_STR_KEYS | (orjson.OPT_INDENT_2 if indent else 0)
    with atomic_path(path) as tmp:
        tmp.write_bytes(orjson.dumps(obj, option=option, default=default))
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
    """Read a JSON list or JSONL file; a bad line is refused (`DataError`) naming file, line, field,
    and so is a directory. Records end at `\\n` (bytes: U+2028, U+2029 and U+0085 inside a string
    are never line ends). A leading UTF-8 byte-order mark (an editor's "UTF-8 with BOM") is not
    part of the first record: JSON readers may ignore it (RFC 8259), and `parser ask` does."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: a directory, not a data file; give the JSON or JSONL file itself")
    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
    if path.suffix == ".json" or data.lstrip()[:1] == b"[":
        try:
            rows = parse_json(data)
        except BadJson as e:
            raise DataError(f"{path}: not valid JSON: {e}; fix the file or rebuild it") from None
        if not isinstance(rows, list):
            raise DataError(f"{path}: expected a JSON list of records, got {type(rows).__name__}")
        return rows
    rows = []
    for lineno, line in enumerate(data.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(parse_json(line))
            except BadJson as e:
                raise DataError(f"{path}:{lineno}: not a valid JSON row: {e}; fix or delete that line") from None
    return rows


class JsonlStore:
    """One append-only JSONL file of rows, with one set of rules for every resumable job (the
    eval results store, the knowledge filter's log):

    * A row is acknowledged when `append` returns: its whole line, newline included, was written
      and fsync'd right after the last complete line (and the directory, when the file is new).
    * A failed append (disk full, file-size limit, I/O error) raises and leaves the file as it was:
      the partial line is cut off, and if even that fails the next append overwrites it and cuts
      after itself. (Appending in "a" mode fused the next row onto the fragment.) A lone
      surrogate in a row is written as its escape, never fatal.
    * Opening never fails on content. A last line without its newline that parses is a complete
      row (the newline is added); one that stops mid-JSON is a write that never finished (never
      acknowledged) and is cut off. A bad line elsewhere — not JSON, not UTF-8, a refused value
      (`parse_json`), not an object, no key — is left in the file, skipped and reported by file,
      line and field (`problems`, and a warning); a line where an unfinished write was fused with
      a complete row gives the row back.
    * With `key`, the first row of a key wins (`append` refuses a key already there); later
      duplicates in the file are reported.
    * With `row_type` (a class with `from_dict(obj, source)` and `to_dict()`, e.g.
      `parser.records.result.ResultRow`), rows are read into it and written from it; a line it refuses
      (`DataError`, naming file, line and field) is skipped like any bad line.

    One writer at a time (eval.run holds `lock_run_dir`); `readonly=True` reads without repairing.

        log = JsonlStore("filter.jsonl", key=lambda row: str(row["id"]))
        if "q7" not in log:
            log.append({"id": "q7", ...})
    """

    def __init__(self, path: str | os.PathLike, key: Callable[[Any], Hashable] | None = None, *,
                 readonly: bool = False, row_type: type | None = None):
        self.path, self.key, self.readonly, self.row_type = Path(path), key, readonly, row_type
        self.rows: list[Any] = []
        self.by_key: dict[Hashable, Any] = {}
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
                row, unfinished = self._parse(data[start:], lineno, last=True)
                if not unfinished:
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
            row, _ = self._parse(data[start:newline], lineno, last=False)
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

    def _parse(self, line: bytes, lineno: int, last: bool) -> tuple[dict[str, Any] | None, bool]:
        """(the row or None, whether the line is a write that never finished: only a last line)."""
        if not line.strip():
            return None, False
        try:
            row = parse_json(line)
        except BadJson as error:
            fused = None if error.refused else _fused_row(line)
            if fused is not None:
                self.problems.append(f"{self.path}:{lineno}: an unfinished write was fused with the row after it; "
                                     "the row is read, the fragment skipped")
                return fused, False
            if last and not error.complete:
                return None, True
            self.problems.append(f"{self.path}:{lineno}: not a JSON row ({error}); skipped and left in the file "
                                 "(fix or delete that line, then re-run)")
            return None, False
        if not isinstance(row, dict):
            self.problems.append(f"{self.path}:{lineno}: a JSON {type(row).__name__}, not a row; skipped, left in the file")
            return None, False
        return row, False

    def _accept(self, row: dict[str, Any], lineno: int) -> None:
        if self.row_type is not None:
            try:
                row = self.row_type.from_dict(row, f"{self.path}:{lineno}")
            except DataError as error:
                self.problems.append(f"{error}; skipped, left in the file")
                return
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

    def append(self, row: Any) -> bool:
        """Write one row and fsync it; False (nothing written) if its key is already there.
        Raises OSError if the write fails; the file and the rows before stay as they were."""
        if self.readonly:
            raise ValueError(f"{self.path}: opened read-only")
        if self.row_type is not None and not isinstance(row, self.row_type):
            raise TypeError(f"{self.path}: rows are {self.row_type.__name__}s, got {type(row).__name__}")
        line = dumps_line(row.to_dict() if self.row_type is not None else row)
        with self._lock:
            key = self.key(row) if self.key is not None else None
            if self.key is not None and key in self.by_key:
                return False
            self.path.parent.mkdir(parents=True, exist_ok=True)
            created = not self.path.exists()
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
            if created:
                fsync_dir(self.path.parent)
            self._end += len(line)
            if self.key is not None:
                self.by_key[key] = row
            self.rows.append(row)
            return True


def _fused_row(line: bytes) -> dict[str, Any] | None:
    """The complete row at the end of a line that starts with an unfinished write's fragment:
    the longest suffix starting at `{"` that parses as an object. Each try is orjson's alone (a
    row we wrote is plain JSON), so a line with many candidates costs little."""
    position = line.find(b'{"', 1)
    while position > 0:
        try:
            row = orjson.loads(line[position:])
        except (orjson.JSONDecodeError, RecursionError):
            position = line.find(b'{"', position + 1)
            continue
        if not isinstance(row, dict):
            return None
        try:
            return parse_json(line[position:])  # the same bounds as any row
        except BadJson:
            return None
    return None
