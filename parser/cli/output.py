"""Where a command writes its results: opened, or refused in one line, before anything loads.

    out = open_output("answers.jsonl", document="notes.md")   # parser ask --json answers.jsonl notes.md ...
"""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

from parser.base.config import ConfigError


def open_output(path: str, document: str | Path | None = None) -> BinaryIO:
    """`--json OUT`, opened before any model loads, so a destination that cannot be written (a
    directory, a folder that does not exist, no permission) costs nothing but this line. The
    document itself is refused (opening truncates it), and so is a FIFO no process reads yet
    (opening it would wait for a reader for ever, before anything runs): it is opened without
    blocking, then written as a blocking file, so a pipe with its reader (`--json >(jq .)`) works."""
    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"--json {path}: a directory, not a file")
    if not out.parent.is_dir():
        there = f"{out.parent} is a file, not a folder" if out.parent.exists() else f"the folder {out.parent} does not exist"
        raise ConfigError(f"--json {path}: {there}")
    if document is not None and str(document) != "-" and out.exists() and os.path.samefile(out, document):
        raise ConfigError(f"--json {path}: that is the document being asked; writing would overwrite it")
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o666)
    except OSError as err:
        if err.errno == errno.ENXIO:
            raise ConfigError(f"--json {path}: a FIFO that no process reads; start its reader first") from None
        raise ConfigError(f"--json {path}: cannot be written ({err.strerror or err})") from None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "wb")
