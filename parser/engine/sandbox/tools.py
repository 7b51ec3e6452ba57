"""Direct corpus interaction (DCI): read-only tools over a corpus directory, and nothing more.

The DCI agent and the DCI subagent (paper §4.4, Appendix D.2) look at text only through two
tools: `read(file, offset)` — a line-numbered 200-line window of one file — and
`bash(command)` — one read-only search command (`rg`, `grep`, `ls`, `find`, `head`, `wc`).
A model writes these commands, so the sandbox treats every command as hostile:

* there is no shell: the command is split as `shlex` (POSIX) would split it, in one linear
  pass, and executed as an argument list, so pipes, redirection, `;`/`&&`, backticks, `$(...)`
  and variables are refused up front (a model that thinks it has a shell gets a message saying
  so, not a silent literal);
* only allowlisted programs run, with only allowlisted options spelled in full
  (`parser.engine.sandbox.options`: GNU tools take abbreviations, so a denylist cannot hold); `find`
  takes only allowlisted predicates (no `-exec/-delete/-fprint`, nothing that follows symlinks);
  `rg` reads no config and no ignore files (those above the corpus would hide its files);
* every argument that could name a path is resolved (`realpath`, symlinks followed) and must
  stay inside the corpus, so `..`, absolute paths and symlinks that point outside are refused;
  `read` then opens the resolved path once, component by component without following
  symlinks, and refuses anything but a regular file with one link (a hard link can name a file
  outside); `bash` refuses to run while the corpus holds a multi-link file;
* everything is bounded (`SandboxLimits`, configs/sandbox/default.yaml): each command has a
  deadline that is always honoured (its whole process group is killed, its output drained as
  it comes, and it dies with the process that started it), a scrubbed environment, no stdin,
  kernel limits (address space, CPU seconds, no file writes) so a backtracking regex cannot eat
  the machine, and a share of `ProcessSlots` (commands at once); output is capped at 20,000
  characters (`read` keeps the head, `bash` the tail, as in the paper); `read` streams at most
  `max_read_bytes` of a file off the event loop and numbers lines as `grep -n` does.

`call()` turns every problem — a refusal, an odd argument (`inf`, a lone surrogate, a list
instead of an object) — into an "Error: ..." string; docs/security.md says what and why.

`SandboxTools` offers the two tools to an agent of the episode engine (the DCI agent,
`parser.methods.dci`, and the DCI subagent, `parser.engine.readers.dci`).

This module never runs a shell and never writes anywhere but the corpus it is asked to create.

    sandbox = Sandbox(materialize_corpus(document, tmpdir))
    print(await sandbox.call("bash", {"command": "rg -n 'Film X' ."}))
    await engine.run_tools(question, SandboxTools(sandbox, "dci", templates=parser.methods.dci.PROMPTS))
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import re
import shutil
import stat
import sysconfig
from pathlib import Path
from typing import Any, Mapping

from parser.engine import prompts
from parser.text.chunking import split_paragraphs
from parser.engine.sandbox.options import OptionRefused, check_options
from parser.engine.sandbox.process import ProcessSlots, run_limited
from parser.engine.tools import FunctionTools, TurnRules

ALLOWED_COMMANDS = ("rg", "grep", "ls", "find", "head", "wc")
# The bounds (SandboxLimits; configs/sandbox/default.yaml sets them for the methods):
MAX_OUTPUT_CHARS = 20_000
READ_WINDOW_LINES = 200
MEMORY_LIMIT_BYTES = 1 << 30  # address space per command: grep/rg search in far less
MAX_COMMAND_CHARS = 8192  # a model's command; longer ones are refused before parsing
MAX_READ_BYTES = 64 << 20  # `read` scans at most this much of a file (in a thread, streamed)
MAX_PROCESSES = 8  # commands running at once per ProcessSlots (a turn may ask for thousands)
# ripgrep reads .gitignore/.ignore/.rgignore files in the directories *above* the corpus (and git's
# global excludes): their rules would hide corpus files and their lines show up in rg's errors.
# The corpus holds no ignore files of its own; an explicit --ignore-file (confined) still applies.
_RG_FIXED_ARGS = ("--no-config", "--no-ignore")

# find's expression language can execute, delete and write files, so it is allowlisted instead.
_FIND_OPTIONS_WITH_VALUE = {
    "-name", "-iname", "-path", "-ipath", "-wholename", "-iwholename", "-regex", "-iregex", "-type",
    "-maxdepth", "-mindepth", "-size", "-mtime", "-mmin", "-newer", "-printf", "-regextype", "-links",
}
_FIND_OPTIONS_FLAG = {"-print", "-print0", "-empty", "-not", "-a", "-and", "-o", "-or", "-true", "-false", "-readable", "-P"}
_FIND_OPERATORS = {"!", "(", ")", ","}


class Refused(ValueError):
    """The command or argument is outside what the sandbox allows; the message says why."""


def _locate(program: str) -> str | None:
    """The program on PATH, else beside this interpreter (the `ripgrep` wheel installs `rg`
    into the virtual environment's scripts folder, which need not be on PATH)."""
    found = shutil.which(program)
    if found:
        return found
    candidate = Path(sysconfig.get_path("scripts")) / program
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


_OPERATORS = {";": "command chaining (;)", "&": "command chaining / background (&, &&)", "|": "pipes (|)",
              "<": "redirection (<)", ">": "redirection (>)", "(": "subshells", ")": "subshells"}
_SPECIAL_PARAMETERS = "({_@*#?$!-0123456789"  # after `$`: what a shell would substitute
_PLAIN_RUN = re.compile(r"[^ \t'\"\\`$;&|<>()]+")  # characters that mean nothing to a shell
_QUOTED_RUN = re.compile(r'[^"\\`$]+')  # the same inside double quotes


def _refuse_substitution(command: str, i: int) -> None:
    """Refuse a backtick or a `$` that a shell would expand (outside single quotes)."""
    if command[i] == "`":
        raise Refused("refused: backticks (command substitution) are not supported; there is no shell")
    if command[i] == "$" and i + 1 < len(command) and (command[i + 1].isalpha() or command[i + 1] in _SPECIAL_PARAMETERS):
        what = "command substitution" if command[i + 1] == "(" else "variable expansion"
        raise Refused(f"refused: {what} ($...) is not supported; there is no shell")


def split_command(command: str) -> list[str]:
    """The argument vector `shlex.split` (POSIX mode) would give, refusing what a shell would
    interpret: operators and substitutions outside single quotes.

    One linear pass: `shlex` grows each token by string concatenation on an attribute, which
    is quadratic in the longest argument (a 1 MB pattern took minutes)."""
    if "\n" in command or "\r" in command:
        raise Refused("refused: one command per call; newlines are not allowed")
    if "\x00" in command:
        raise Refused("refused: NUL byte in command")
    words: list[str] = []
    word: list[str] = []
    in_word = False
    i, n = 0, len(command)
    while i < n:
        ch = command[i]
        if ch in " \t":
            if in_word:
                words.append("".join(word))
                word, in_word = [], False
            i += 1
            continue
        in_word = True
        if ch == "'":  # literal up to the next single quote
            end = command.find("'", i + 1)
            if end < 0:
                raise Refused("refused: unterminated ' quote")
            word.append(command[i + 1 : end])
            i = end + 1
        elif ch == '"':  # a backslash escapes only `"` and `\\` here, as in shlex
            i += 1
            while True:
                if i >= n:
                    raise Refused('refused: unterminated " quote')
                run = _QUOTED_RUN.match(command, i)
                if run:
                    word.append(run.group())
                    i = run.end()
                    continue
                c = command[i]
                if c == '"':
                    i += 1
                    break
                if c == "\\" and i + 1 < n and command[i + 1] in '"\\':
                    word.append(command[i + 1])
                    i += 2
                    continue
                _refuse_substitution(command, i)
                word.append(c)
                i += 1
        elif ch == "\\":
            if i + 1 >= n:
                raise Refused("refused: cannot parse command (a trailing backslash escapes nothing)")
            word.append(command[i + 1])
            i += 2
        elif run := _PLAIN_RUN.match(command, i):
            word.append(run.group())
            i = run.end()
        else:
            _refuse_substitution(command, i)
            if ch in _OPERATORS:
                raise Refused(f"refused: {_OPERATORS[ch]} not supported; run one allowlisted command per call ({', '.join(ALLOWED_COMMANDS)})")
            word.append(ch)
            i += 1
    if in_word:
        words.append("".join(word))
    return words


def _truncate(text: str, limit: int, keep: str) -> str:
    if len(text) <= limit:
        return text
    if keep == "head":
        note = f"\n[output truncated: showing the first {limit} of {len(text)} characters]"
        return text[:limit] + note
    note = f"[output truncated: showing the last {limit} of {len(text)} characters; narrow the search (e.g. rg -l, -m N, a more specific pattern)]\n"
    return note + text[-limit:]


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Every bound of a sandbox, set from a method's or reader's `sandbox:` config block.

    `timeout_s` per command, always honoured (the command's process group is killed at the
    deadline and `bash` returns at most `dci_process.KILL_GRACE_S` later, whatever the command
    does with its output); `memory_limit_bytes` of address space (RLIMIT_AS) and CPU seconds = timeout + 1 per
    command; `max_output_chars` of output shown; `max_command_chars` of command; `read_window`
    lines and `max_read_bytes` scanned per `read`; `max_processes` commands at once (shared by
    the sandboxes of one method or reader through `ProcessSlots`).
    """

    timeout_s: float = 30.0
    max_output_chars: int = MAX_OUTPUT_CHARS
    read_window: int = READ_WINDOW_LINES
    memory_limit_bytes: int = MEMORY_LIMIT_BYTES
    max_command_chars: int = MAX_COMMAND_CHARS
    max_read_bytes: int = MAX_READ_BYTES
    max_processes: int = MAX_PROCESSES

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            whole = field.name != "timeout_s"
            if (isinstance(value, bool) or not isinstance(value, int if whole else (int, float))
                    or not 0 < value < math.inf):
                kind = "a positive integer" if whole else "a positive finite number of seconds"
                raise ValueError(f"sandbox.{field.name} must be {kind}, got {value!r}")

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> "SandboxLimits":
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(config or {}) - known)
        if unknown:
            raise ValueError(f"sandbox: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**dict(config or {}))


class Sandbox:
    """Read-only tools over one corpus directory, within `limits` (`SandboxLimits`; keyword
    overrides replace single fields, e.g. `Sandbox(root, timeout_s=5)`).

    `call(name, arguments)` never raises on model input: refusals and errors come back as text
    the model can read. `bash`/`read` raise `Refused` (tests check the messages). `slots` bounds
    the commands running at once; pass one `ProcessSlots` to every sandbox of a method.
    """

    def __init__(self, root: str | os.PathLike[str], limits: SandboxLimits | None = None, *,
                 slots: ProcessSlots | None = None, **overrides: Any):
        self.root = Path(os.path.realpath(root))
        if not self.root.is_dir():
            raise FileNotFoundError(f"corpus directory {root} does not exist")
        self.limits = dataclasses.replace(limits or SandboxLimits(), **overrides)
        self.slots = slots if slots is not None else ProcessSlots(self.limits.max_processes)
        self.programs = {name: path for name in ALLOWED_COMMANDS if (path := _locate(name))}
        # The only environment a command sees: no RIPGREP_CONFIG_PATH, GREP_OPTIONS, HOME, ...
        # MALLOC_ARENA_MAX: glibc reserves 64 MB of address space per thread arena, so `rg -j 64`
        # under the address-space limit would fail to spawn threads (and rg 14 then hangs).
        self.env = {"PATH": os.pathsep.join(sorted({str(Path(p).parent) for p in self.programs.values()})), "LC_ALL": "C.UTF-8",
                    "MALLOC_ARENA_MAX": "2"}

    # -- paths -----------------------------------------------------------------------------
    def resolve(self, path: str) -> Path:
        """`path` (relative to the corpus, or absolute) resolved with symlinks; must stay inside."""
        if "\x00" in path:
            raise Refused("refused: NUL byte in path")
        _check_encodable(path, "path")
        resolved = Path(os.path.realpath(os.path.join(self.root, path)))
        if resolved != self.root and self.root not in resolved.parents:
            raise Refused(f"refused: path {path!r} is outside the corpus directory (resolves to {resolved}); only files under the corpus can be read")
        return resolved

    def _open_inside(self, path: Path, shown: str) -> int:
        """A descriptor for the resolved `path`, opened once: each component without following
        symlinks (one swapped in after `resolve` fails the open), and only a regular file with a
        single link (a hard link inside the corpus can be the very file outside it)."""
        not_a_file = Refused(f"read: {shown!r} is not a file in the corpus (use bash 'ls' or 'find' to list files)")
        parts = path.relative_to(self.root).parts
        if not parts:
            raise not_a_file
        directory = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts[:-1]:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
                os.close(directory)
                directory = inner
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=directory)
        except OSError as error:
            raise Refused(f"read: {shown!r} changed while it was opened or cannot be opened ({error.strerror})") from None
        finally:
            os.close(directory)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.close(fd)
            if stat.S_ISREG(info.st_mode):
                raise Refused(f"refused: {shown!r} has {info.st_nlink} hard links; a multi-link file may be a file outside the corpus")
            raise not_a_file
        return fd

    def _check_no_hard_links(self) -> None:
        """Refuse to run a command while any regular file in the corpus has more than one link.

        The walk holds one directory descriptor and opens each child by name relative to it
        (and climbs back through ".."), never a full path: a tree deeper than PATH_MAX, which
        `grep -r` still reads, is checked to the bottom instead of failing every command."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            stack = [(_identity(fd), self._subdirectories(fd, ()), ())]
            while stack:
                _, pending, parts = stack[-1]
                if pending:
                    name = pending.pop()
                    try:
                        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    except OSError as error:
                        raise Refused(f"refused: corpus directory {'/'.join((*parts, name))!r} cannot be checked "
                                      f"({error.strerror}); commands stay off until it can") from None
                    os.close(fd)
                    fd = child
                    stack.append((_identity(fd), self._subdirectories(fd, (*parts, name)), (*parts, name)))
                    continue
                stack.pop()
                if stack:
                    parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                    os.close(fd)
                    fd = parent
                    if _identity(fd) != stack[-1][0]:
                        raise Refused("refused: the corpus changed while it was checked; try the command again")
        finally:
            os.close(fd)

    def _subdirectories(self, fd: int, parts: tuple[str, ...]) -> list[str]:
        """The names of the subdirectories of the open directory `fd`; a multi-link file in it is refused."""
        subdirectories = []
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    subdirectories.append(entry.name)
                elif entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_nlink > 1:
                    shown = "/".join((*parts, entry.name))
                    raise Refused(f"refused: corpus file {shown!r} has several hard links (it may be a file outside the corpus); commands stay off until it is removed")
        return subdirectories

    def display(self, path: Path) -> str:
        return "." if path == self.root else str(path.relative_to(self.root))

    # -- read ------------------------------------------------------------------------------
    def read(self, file: str, offset: int = 1) -> str:
        """Lines `offset`.. `offset+window-1` (1-based) of `file`, numbered like `cat -n`.

        A line ends at "\\n" only, as `grep -n`, `rg -n` and `wc -l` count them (`splitlines`
        also splits at \\r, \\f, \\v, U+0085, U+2028, ... and the numbers would disagree). The
        file is streamed: at most `max_read_bytes` are scanned and only the window is kept."""
        if not isinstance(file, str) or not file:
            raise Refused("read needs a 'file' argument (a path relative to the corpus)")
        offset = _line_number(offset)
        path = self.resolve(file)
        with open(self._open_inside(path, file), "rb", buffering=0) as handle:
            window, lines, complete, clipped = self._scan(handle, offset)
        shown = [line.decode("utf-8", errors="replace").removesuffix("\r") for line in window]
        body = "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(shown, start=offset))
        last = offset - 1 + len(window)
        total = f"{lines}" if complete else f"at least {lines} (read scans the first {self.limits.max_read_bytes} bytes of a file; search the rest with bash rg -n / grep -n)"
        if not window and not complete:
            footer = f"[offset {offset} is past the {lines} lines in the first {self.limits.max_read_bytes} bytes of {self.display(path)}, all that read scans; search the rest with bash rg -n / grep -n]"
        elif not window:
            footer = f"[{self.display(path)} has {total} lines; offset {offset} is past the end]"
        elif last < lines or not complete:
            footer = f"[lines {offset}-{last} of {total}; call read with offset={last + 1} to continue]"
        else:
            footer = f"[lines {offset}-{last} of {total}; end of file]"
        if clipped or len(body) > self.limits.max_output_chars:
            body = body[: self.limits.max_output_chars] + f"\n[output truncated: showing the first {self.limits.max_output_chars} characters of lines {offset}-{last}]"
        return body + "\n" + footer

    def _scan(self, handle: Any, offset: int) -> tuple[list[bytes], int, bool, bool]:
        """(the window's lines, lines counted, whether the whole file was scanned, whether the
        window's text was clipped): one pass in 1 MiB blocks, keeping at most ~4 x
        `max_output_chars` bytes of the window (more could not be shown)."""
        last_wanted = offset + self.limits.read_window - 1
        budget = 4 * self.limits.max_output_chars
        window: list[bytes] = []
        current = bytearray()
        line, scanned, kept, ends_with_newline, clipped = 1, 0, 0, True, False
        while scanned < self.limits.max_read_bytes:
            block = handle.read(min(1 << 20, self.limits.max_read_bytes - scanned))
            if not block:
                break
            scanned += len(block)
            ends_with_newline = block.endswith(b"\n")
            pos = 0
            while pos < len(block):
                if line > last_wanted:  # past the window: only count
                    line += block.count(b"\n", pos)
                    break
                newline = block.find(b"\n", pos)
                end = len(block) if newline < 0 else newline
                if line >= offset:
                    room = budget - kept - len(current)
                    clipped = clipped or end - pos > room
                    current += block[pos : pos + max(room, 0) if end - pos > room else end]
                if newline < 0:
                    break
                if line >= offset:
                    window.append(bytes(current))
                    kept += len(current)
                current = bytearray()
                line, pos = line + 1, newline + 1
        complete = scanned < self.limits.max_read_bytes or not handle.read(1)
        if not complete:  # the line cut by the bound is not counted, and shown only if it is all there is
            if not window and line == offset:
                window.append(bytes(current))
                clipped = True
            return window, line - 1, False, clipped
        if not ends_with_newline and offset <= line <= last_wanted:
            window.append(bytes(current))
        return window, line - 1 + (0 if ends_with_newline else 1), True, clipped

    # -- bash ------------------------------------------------------------------------------
    def parse(self, command: str) -> list[str]:
        """Validate `command` and return the argument vector to execute (program resolved)."""
        if not isinstance(command, str) or not command.strip():
            raise Refused("bash needs a non-empty 'command'")
        if len(command) > self.limits.max_command_chars:
            raise Refused(f"refused: the command is {len(command)} characters; at most {self.limits.max_command_chars} are accepted")
        _check_encodable(command, "command")
        argv = split_command(command)
        if not argv:
            raise Refused("bash needs a non-empty 'command'")
        program = argv[0]
        if program not in ALLOWED_COMMANDS:
            hint = " (use the read tool to view a file)" if program in {"cat", "less", "more", "tail", "sed", "awk"} else ""
            raise Refused(f"refused: command {program!r} is not allowed; allowed: {', '.join(ALLOWED_COMMANDS)}{hint}")
        if program not in self.programs:
            raise Refused(f"refused: {program!r} is not installed on this machine; use grep instead" if program == "rg" else f"refused: {program!r} is not installed")
        args = argv[1:]
        if program == "find":
            self._check_find(args)
            also_paths = []
        else:
            try:
                also_paths = check_options(program, args)
            except OptionRefused as error:
                raise Refused(str(error)) from None
        # every argument that could name a path must stay in the corpus (patterns included: a
        # pattern that looks like an outside path is refused too, which costs nothing real)
        for value in [*also_paths, *(arg for arg in args if not arg.startswith("-"))]:
            if value and value != "-":
                self.resolve(value)
        return [self.programs[program], *(_RG_FIXED_ARGS if program == "rg" else ()), *args]

    def _check_find(self, args: list[str]) -> None:
        expect_value = False
        for arg in args:
            if expect_value:
                expect_value = False
                continue
            if arg in _FIND_OPERATORS or arg in _FIND_OPTIONS_FLAG:
                continue
            if arg in _FIND_OPTIONS_WITH_VALUE:
                expect_value = True
                continue
            if arg.startswith("-"):
                allowed = sorted(_FIND_OPTIONS_WITH_VALUE | _FIND_OPTIONS_FLAG)
                raise Refused(f"refused: find {arg} is not allowed (find may only search and print; allowed: {' '.join(allowed)})")

    async def bash(self, command: str) -> str:
        argv = self.parse(command)
        self._check_no_hard_links()
        try:
            async with self.slots():
                done = await run_limited(argv, cwd=self.root, env=self.env, timeout_s=self.limits.timeout_s,
                                         memory_limit_bytes=self.limits.memory_limit_bytes, keep_bytes=8 * self.limits.max_output_chars)
        except (OSError, ValueError) as error:
            raise Refused(f"bash: could not start {argv[0]}: {error}") from None
        output, total, returncode, timed_out = done.output, done.total_bytes, done.returncode, done.timed_out
        text = output.decode("utf-8", errors="replace")
        if total > len(output):  # the rolling buffer dropped the head already
            text = f"[output truncated: showing the last {len(output)} of {total} bytes]\n" + text
        text = _truncate(text, self.limits.max_output_chars, "tail")
        if timed_out:
            text += f"\n[command timed out after {self.limits.timeout_s:g} s and was stopped]"
        elif returncode == 1 and not text.strip() and argv[0].endswith(("rg", "grep")):
            text = "(no matches)"
        elif returncode not in (0, None):
            text += f"\n[exit status {returncode}{_signal_note(returncode)}]"
        return text if text.strip() else "(no output)"

    # -- the model-facing entry point ------------------------------------------------------
    async def call(self, name: str, arguments: Any) -> str:
        """Run one tool call from a model; every problem comes back as readable text."""
        if not isinstance(arguments, dict):
            return f"Error: {name} takes an object of named arguments, got {type(arguments).__name__}"
        try:
            if name == "read":  # in a thread: a large file must not stall the other episodes' loop
                return await asyncio.to_thread(self.read, arguments.get("file", arguments.get("path", "")), arguments.get("offset", 1))
            if name == "bash":
                return await self.bash(arguments.get("command", ""))
            return f"Error: unknown tool {name!r}; the tools are read and bash"
        except Refused as error:
            return f"Error: {error}"
        except (OSError, UnicodeError) as error:  # e.g. a corpus file made unreadable mid-run
            return f"Error: {name}: {type(error).__name__}: {error}"


def _check_encodable(text: str, what: str) -> None:
    """A lone surrogate (from a JSON escape) cannot be passed to a program or the filesystem."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused(f"refused: the {what} is not valid Unicode text (lone surrogate)") from None


def _line_number(value: Any) -> int:
    """A 1-based line number from model JSON: an int, an integral finite float, or digits."""
    if isinstance(value, str) and len(value.strip()) <= 12 and value.strip().lstrip("+-").isdigit():
        value = int(value.strip())
    if isinstance(value, float) and math.isfinite(value):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise Refused(f"read: offset must be a line number, got {str(value)[:40]!r}")
    return min(max(value, 1), 10**9)


def _signal_note(returncode: int) -> str:
    """Name the limit a killed command ran into (a negative code is the signal that killed it)."""
    notes = {-9: "killed", -24: "CPU time limit", -25: "tried to write a file", -6: "aborted (out of memory?)", -11: "crashed (out of memory?)"}
    return f", {notes[returncode]}" if returncode in notes else ""


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def materialize_corpus(document: str, directory: str | os.PathLike[str], *, layout: str = "paragraphs") -> Path:
    """Write `document` under `directory` as the corpus a DCI agent searches.

    `paragraphs`: one file per packed paragraph (`doc_00017.txt` for "Document 17"), so `rg -l`
    names the paragraph that matched; a number seen again gets `doc_00017_2.txt`, ... (files are
    created exclusively: no paragraph ever overwrites another); `single`: one `document.txt`.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    if layout == "single":
        (root / "document.txt").write_text(document, encoding="utf-8")
        return root
    if layout != "paragraphs":
        raise ValueError(f"unknown corpus layout {layout!r}; use 'paragraphs' or 'single'")
    seen: dict[int, int] = {}
    for position, paragraph in enumerate(split_paragraphs(document)):
        if paragraph.index is None:
            name = f"part_{position:05d}.txt"
        else:
            seen[paragraph.index] = repeat = seen.get(paragraph.index, 0) + 1
            name = f"doc_{paragraph.index:05d}.txt" if repeat == 1 else f"doc_{paragraph.index:05d}_{repeat}.txt"
        with open(root / name, "x", encoding="utf-8") as handle:
            handle.write(paragraph.text + "\n")
    return root


class SandboxTools(FunctionTools):
    """`read(file, offset)` and `bash(command)` confined to one corpus directory.

    `prompt` names the system/user templates in `templates`: "dci_subagent" in the shared
    `prompts.TOOLSETS` (ParSer's DCI reader, user field `query`; the default) or "dci" in the DCI
    agent's own set (`parser.methods.dci.PROMPTS`, user field `question`); `rules` are the
    reference's turn rules (configs/episode/dci.yaml `turn_rules:`; none by default).
    """

    def __init__(self, sandbox: Sandbox, prompt: str = "dci_subagent", version: str = prompts.DEFAULT_VERSION,
                 rules: TurnRules = TurnRules(), *, templates: prompts.PromptSet = prompts.TOOLSETS):
        self.sandbox, self.prompt, self.version, self.rules, self.templates = sandbox, prompt, version, rules, templates
        self.functions = {"read": self.read, "bash": self.bash}
        self.tool_schemas = prompts.TOOLSETS.schemas("read", "bash", version=version)

    async def read(self, arguments: dict[str, Any]) -> str:
        return await self.sandbox.call("read", arguments)

    async def bash(self, arguments: dict[str, Any]) -> str:
        return await self.sandbox.call("bash", arguments)

    def system_prompt(self) -> str:
        return self.templates.render(f"{self.prompt}_system", self.version)

    def user_prompt(self, question: str) -> str:
        field = "query" if self.prompt == "dci_subagent" else "question"
        return self.templates.render(f"{self.prompt}_user", self.version, **{field: question})

    def invalid_action(self, error: str) -> str:
        return prompts.TOOLSETS.render("invalid_action", self.version, error=error)
