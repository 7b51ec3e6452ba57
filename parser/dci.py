"""Direct corpus interaction (DCI): read-only tools over a corpus directory, and nothing more.

The DCI agent and the DCI subagent (paper §4.4, Appendix D.2) look at text only through two
tools: `read(file, offset)` — a line-numbered 200-line window of one file — and
`bash(command)` — one read-only search command (`rg`, `grep`, `ls`, `find`, `head`, `wc`).
A model writes these commands, so the sandbox treats every command as hostile:

* there is no shell: the command is split with `shlex` and executed as an argument list, so
  pipes, redirection, `;`/`&&`, backticks, `$(...)` and variables are refused up front (a
  model that thinks it has a shell gets a message saying so, not a silent literal);
* only allowlisted programs run, with only allowlisted options spelled in full
  (`parser.dci_options`: GNU tools take abbreviations, so a denylist cannot hold); `find`
  takes only allowlisted predicates (no `-exec/-delete/-fprint`, nothing that follows symlinks);
* every argument that could name a path is resolved (`realpath`, symlinks followed) and must
  stay inside the corpus, so `..`, absolute paths and symlinks that point outside are refused;
  `read` then opens the resolved path once, component by component without following
  symlinks, and refuses anything but a regular file with one link (a hard link can name a file
  outside); `bash` refuses to run while the corpus holds a multi-link file;
* each command has a timeout, a scrubbed environment, no stdin, and kernel limits (address
  space, CPU seconds, no file writes) so a backtracking regex cannot eat the machine; output is
  capped at 20,000 characters (`read` keeps the head, `bash` the tail, as in the paper).

`call()` turns every problem — a refusal, an odd argument (`inf`, a lone surrogate, a list
instead of an object) — into an "Error: ..." string; docs/security.md says what and why.

`SandboxTools` offers the two tools to an agent of the episode engine (the DCI agent,
`parser.methods.dci_agent`, and the DCI subagent, `parser.readers.dci`).

This module never runs a shell and never writes anywhere but the corpus it is asked to create.

    sandbox = Sandbox(materialize_corpus(document, tmpdir))
    print(await sandbox.call("bash", {"command": "rg -n 'Film X' ."}))
    await engine.run_tools(question, SandboxTools(sandbox, "dci"))
"""
from __future__ import annotations

import asyncio
import math
import os
import shlex
import shutil
import stat
import sys
import sysconfig
from pathlib import Path
from typing import Any

from parser import prompts
from parser.chunking import split_paragraphs
from parser.dci_options import OptionRefused, check_options
from parser.tools import FunctionTools, TurnRules

ALLOWED_COMMANDS = ("rg", "grep", "ls", "find", "head", "wc")
MAX_OUTPUT_CHARS = 20_000
READ_WINDOW_LINES = 200
MEMORY_LIMIT_BYTES = 1 << 30  # address space per command: grep/rg search in far less
# Runs before the tool (same process, via exec): set the limits, then become the tool. An
# interpreter shim rather than `preexec_fn`, which is unsafe in a process with threads.
_LIMITS_SHIM = (
    "import os, resource as r, sys\n"
    "memory, cpu = int(sys.argv[1]), int(sys.argv[2])\n"
    "r.setrlimit(r.RLIMIT_AS, (memory, memory))\n"
    "r.setrlimit(r.RLIMIT_CPU, (cpu, cpu + 1))\n"
    "r.setrlimit(r.RLIMIT_FSIZE, (0, 0))\n"
    "r.setrlimit(r.RLIMIT_CORE, (0, 0))\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n"
)

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


def _check_no_shell_syntax(command: str) -> None:
    """Refuse what a shell would interpret: operators and substitutions outside single quotes."""
    if "\n" in command or "\r" in command:
        raise Refused("refused: one command per call; newlines are not allowed")
    if "\x00" in command:
        raise Refused("refused: NUL byte in command")
    quote: str | None = None
    i = 0
    while i < len(command):
        ch = command[i]
        if quote == "'":
            quote = None if ch == "'" else quote
        elif ch == "\\" and quote is None:
            i += 1  # the next character is literal
        elif ch == "`":
            raise Refused("refused: backticks (command substitution) are not supported; there is no shell")
        elif ch == "$" and i + 1 < len(command) and (command[i + 1] in "({" or command[i + 1].isalpha() or command[i + 1] == "_"):
            what = "command substitution" if command[i + 1] == "(" else "variable expansion"
            raise Refused(f"refused: {what} ($...) is not supported; there is no shell")
        elif quote == '"':
            quote = None if ch == '"' else quote
        elif ch in "'\"":
            quote = ch
        elif ch in ";&|<>()":
            kinds = {";": "command chaining (;)", "&": "command chaining / background (&, &&)", "|": "pipes (|)",
                     "<": "redirection (<)", ">": "redirection (>)", "(": "subshells", ")": "subshells"}
            raise Refused(f"refused: {kinds[ch]} not supported; run one allowlisted command per call ({', '.join(ALLOWED_COMMANDS)})")
        i += 1
    if quote:
        raise Refused(f"refused: unterminated {quote} quote")


def _truncate(text: str, limit: int, keep: str) -> str:
    if len(text) <= limit:
        return text
    if keep == "head":
        note = f"\n[output truncated: showing the first {limit} of {len(text)} characters]"
        return text[:limit] + note
    note = f"[output truncated: showing the last {limit} of {len(text)} characters; narrow the search (e.g. rg -l, -m N, a more specific pattern)]\n"
    return note + text[-limit:]


class Sandbox:
    """Read-only tools over one corpus directory.

    `call(name, arguments)` never raises on model input: refusals and errors come back as text
    the model can read. `bash`/`read` raise `Refused` (tests check the messages).
    `memory_limit_bytes` caps each command's address space (RLIMIT_AS); CPU seconds are capped
    at the timeout plus one.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        timeout_s: float = 30.0,
        max_output_chars: int = MAX_OUTPUT_CHARS,
        read_window: int = READ_WINDOW_LINES,
        memory_limit_bytes: int = MEMORY_LIMIT_BYTES,
    ):
        self.root = Path(os.path.realpath(root))
        if not self.root.is_dir():
            raise FileNotFoundError(f"corpus directory {root} does not exist")
        self.timeout_s = timeout_s
        self.memory_limit_bytes = memory_limit_bytes
        self.max_output_chars = max_output_chars
        self.read_window = read_window
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
        """Refuse to run a command while any regular file in the corpus has more than one link."""
        pending = [str(self.root)]
        while pending:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                    elif entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_nlink > 1:
                        shown = self.display(Path(entry.path))
                        raise Refused(f"refused: corpus file {shown!r} has several hard links (it may be a file outside the corpus); commands stay off until it is removed")

    def display(self, path: Path) -> str:
        return "." if path == self.root else str(path.relative_to(self.root))

    # -- read ------------------------------------------------------------------------------
    def read(self, file: str, offset: int = 1) -> str:
        """Lines `offset`.. `offset+window-1` (1-based) of `file`, numbered like `cat -n`."""
        if not isinstance(file, str) or not file:
            raise Refused("read needs a 'file' argument (a path relative to the corpus)")
        offset = _line_number(offset)
        path = self.resolve(file)
        with open(self._open_inside(path, file), encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
        window = lines[offset - 1 : offset - 1 + self.read_window]
        body = "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(window, start=offset))
        last = offset - 1 + len(window)
        if not window:
            footer = f"[{self.display(path)} has {len(lines)} lines; offset {offset} is past the end]"
        elif last < len(lines):
            footer = f"[lines {offset}-{last} of {len(lines)}; call read with offset={last + 1} to continue]"
        else:
            footer = f"[lines {offset}-{last} of {len(lines)}; end of file]"
        return _truncate(body, self.max_output_chars, "head") + "\n" + footer

    # -- bash ------------------------------------------------------------------------------
    def parse(self, command: str) -> list[str]:
        """Validate `command` and return the argument vector to execute (program resolved)."""
        if not isinstance(command, str) or not command.strip():
            raise Refused("bash needs a non-empty 'command'")
        _check_encodable(command, "command")
        _check_no_shell_syntax(command)
        try:
            argv = shlex.split(command)
        except ValueError as error:
            raise Refused(f"refused: cannot parse command ({error})") from None
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
        return [self.programs[program], *args]

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
        cpu_s = str(math.ceil(self.timeout_s) + 1)
        limited = [sys.executable, "-I", "-S", "-c", _LIMITS_SHIM, str(self.memory_limit_bytes), cpu_s, *argv]
        try:
            process = await asyncio.create_subprocess_exec(
                *limited, cwd=self.root, env=self.env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            )
        except (OSError, ValueError) as error:
            raise Refused(f"bash: could not start {argv[0]}: {error}") from None
        output, total, timed_out = await self._collect(process)
        text = output.decode("utf-8", errors="replace")
        if total > len(output):  # the rolling buffer dropped the head already
            text = f"[output truncated: showing the last {len(output)} of {total} bytes]\n" + text
        text = _truncate(text, self.max_output_chars, "tail")
        if timed_out:
            text += f"\n[command timed out after {self.timeout_s:.0f} s and was stopped]"
        elif process.returncode == 1 and not text.strip() and argv[0].endswith(("rg", "grep")):
            text = "(no matches)"
        elif process.returncode not in (0, None):
            text += f"\n[exit status {process.returncode}{_signal_note(process.returncode)}]"
        return text if text.strip() else "(no output)"

    async def _collect(self, process: asyncio.subprocess.Process) -> tuple[bytes, int, bool]:
        """Read all output, keeping only a bounded tail in memory; stop the process on timeout."""
        keep = 8 * self.max_output_chars
        buffer, total = bytearray(), 0

        async def pump() -> None:
            nonlocal total
            assert process.stdout is not None
            while chunk := await process.stdout.read(65536):
                total += len(chunk)
                buffer.extend(chunk)
                if len(buffer) > 2 * keep:
                    del buffer[: len(buffer) - keep]
            await process.wait()

        try:
            await asyncio.wait_for(pump(), self.timeout_s)
            return bytes(buffer[-keep:]), total, False
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            return bytes(buffer[-keep:]), total, True

    # -- the model-facing entry point ------------------------------------------------------
    async def call(self, name: str, arguments: Any) -> str:
        """Run one tool call from a model; every problem comes back as readable text."""
        if not isinstance(arguments, dict):
            return f"Error: {name} takes an object of named arguments, got {type(arguments).__name__}"
        try:
            if name == "read":
                return self.read(arguments.get("file", arguments.get("path", "")), arguments.get("offset", 1))
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


def materialize_corpus(document: str, directory: str | os.PathLike[str], *, layout: str = "paragraphs") -> Path:
    """Write `document` under `directory` as the corpus a DCI agent searches.

    `paragraphs`: one file per packed paragraph (`doc_00017.txt` for "Document 17"), so `rg -l`
    names the paragraph that matched; `single`: one `document.txt`.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    if layout == "single":
        (root / "document.txt").write_text(document, encoding="utf-8")
        return root
    if layout != "paragraphs":
        raise ValueError(f"unknown corpus layout {layout!r}; use 'paragraphs' or 'single'")
    for position, paragraph in enumerate(split_paragraphs(document)):
        name = f"doc_{paragraph.index:05d}.txt" if paragraph.index is not None else f"part_{position:05d}.txt"
        (root / name).write_text(paragraph.text + "\n", encoding="utf-8")
    return root


class SandboxTools(FunctionTools):
    """`read(file, offset)` and `bash(command)` confined to one corpus directory.

    `prompt` names the system/user templates: "dci" (the standalone agent, user field
    `question`) or "dci_subagent" (ParSer's DCI reader, user field `query`); `rules` are the
    reference's turn rules (configs/episode/dci.yaml `turn_rules:`; none by default).
    """

    def __init__(self, sandbox: Sandbox, prompt: str = "dci", version: str = prompts.DEFAULT_VERSION,
                 rules: TurnRules = TurnRules()):
        self.sandbox, self.prompt, self.version, self.rules = sandbox, prompt, version, rules
        self.functions = {"read": self.read, "bash": self.bash}
        self.tool_schemas = prompts.baseline_tools("read", "bash", version=version)

    async def read(self, arguments: dict[str, Any]) -> str:
        return await self.sandbox.call("read", arguments)

    async def bash(self, arguments: dict[str, Any]) -> str:
        return await self.sandbox.call("bash", arguments)

    def system_prompt(self) -> str:
        return prompts.BASELINES.render(f"{self.prompt}_system", self.version)

    def user_prompt(self, question: str) -> str:
        field = "query" if self.prompt == "dci_subagent" else "question"
        return prompts.BASELINES.render(f"{self.prompt}_user", self.version, **{field: question})

    def invalid_action(self, error: str) -> str:
        return prompts.BASELINES.render("invalid_action", self.version, error=error)
