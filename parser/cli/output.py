"""Where a command writes its results: opened, or refused in one line, before anything loads.

    out = open_output("answers.jsonl", document="notes.md")   # parser ask --json answers.jsonl notes.md ...
    out = open_output("demo.jsonl", setting="output=")        # parser demo output=demo.jsonl
"""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

from parser.base.config import ConfigError
from parser.records.jsonl import dumps_line


def open_output(path: str, document: str | Path | None = None, setting: str = "--json") -> BinaryIO:
    """`--json OUT` (the demo's `output=`: `setting`), opened before any model loads, so a
    destination that cannot be written (a directory, a folder that does not exist, no permission)
    costs nothing but this line. The document itself is refused (opening truncates it), and so is
    a FIFO no process reads yet (opening it would wait for a reader for ever, before anything
    runs): it is opened without blocking, then written as a blocking file, so a pipe with its
    reader (`--json >(jq .)`) works. Refusals are `ConfigError`s naming `setting` and `path`."""
    try:
        return _open_output(Path(path), document)
    except ConfigError as error:
        raise ConfigError(f"{_named(path, setting)}: {error}") from None


def write_line(out: BinaryIO, row: dict, path: str, setting: str = "--json") -> None:
    """One result as its JSONL line, flushed at once, so a later failure or Ctrl-C keeps it (a lone
    surrogate in model text is written as its escape); a write that fails (the disk filled up, the
    folder went away) is a `ConfigError` naming `setting` and `path`."""
    try:
        out.write(dumps_line(row))
        out.flush()
    except OSError as error:
        raise ConfigError(f"{_named(path, setting)}: cannot be written ({error.strerror or error})") from None


def _named(path: str, setting: str) -> str:
    return f"{setting} {path}" if setting.startswith("-") else f"{setting}{path}"


def _open_output(out: Path, document: str | Path | None) -> BinaryIO:
    """`open_output`'s checks and open; each refusal says only why."""
    if out.is_dir():
        raise ConfigError("a directory, not a file")
    if not out.parent.is_dir():
        raise ConfigError(f"{out.parent} is a file, not a folder" if out.parent.exists() else f"the folder {out.parent} does not exist")
    if document is not None and str(document) != "-" and out.exists() and os.path.samefile(out, document):
        raise ConfigError("that is the document being asked; writing would overwrite it")
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o666)
    except OSError as err:
        if err.errno == errno.ENXIO:
            raise ConfigError("a FIFO that no process reads; start its reader first") from None
        raise ConfigError(f"cannot be written ({err.strerror or err})") from None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "wb")
