"""Direct corpus interaction (DCI): read-only tools over a corpus directory, and nothing more.

The DCI agent and the DCI subagent (paper §4.4, Appendix D.2) look at text only through two
tools: `read(file, offset)` — a line-numbered 200-line window of one file — and
`bash(command)` — one read-only search command (`rg`, `grep`, `ls`, `find`, `head`, `wc`).
A model writes these commands, so the sandbox treats every command as hostile:

* there is no shell: the command is split with `shlex` and executed as an argument list, so
  pipes, redirection, `;`/`&&`, backticks, `$(...)` and variables are refused up front (a
  model that thinks it has a shell gets a message saying so, not a silent literal);
* only allowlisted programs run, and their dangerous flags are refused (`find -exec/-delete/
  -fprint`, `rg --pre/--hostname-bin/--search-zip`, anything that follows symlinks, ...);
  `find` takes only allowlisted predicates;
* every argument that could name a path is resolved (`realpath`, symlinks followed) and must
  stay inside the corpus, so `..`, absolute paths and symlinks that point outside are refused;
* each command has a timeout, a scrubbed environment and no stdin; output is capped at 20,000
  characters (`read` keeps the head, `bash` the tail, as in the paper) with a note that says so.

`SandboxTools` offers the two tools to an agent of the episode engine (the DCI agent,
`parser.methods.dci_agent`, and the DCI subagent, `parser.readers.dci`).

This module never runs a shell and never writes anywhere but the corpus it is asked to create.

    sandbox = Sandbox(materialize_corpus(document, tmpdir))
    print(await sandbox.call("bash", {"command": "rg -n 'Film X' ."}))
    await engine.run_tools(question, SandboxTools(sandbox, "dci"))
"""
from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import sysconfig
from pathlib import Path
from typing import Any

from parser import prompts
from parser.chunking import split_paragraphs
from parser.tools import FunctionTools

ALLOWED_COMMANDS = ("rg", "grep", "ls", "find", "head", "wc")
MAX_OUTPUT_CHARS = 20_000
READ_WINDOW_LINES = 200

# Flags refused per program (long forms match `--flag` and `--flag=value`; single letters are
# checked inside bundles like `-rnL`).
_REFUSED_LONG = {
    "rg": {"--pre", "--pre-glob", "--search-zip", "--follow", "--hostname-bin"},
    "grep": {"--dereference-recursive"},
    "ls": {"--dereference"},
    "wc": {"--files0-from"},
    "head": set(),
}
_REFUSED_SHORT = {"rg": set("zL"), "grep": set("R"), "ls": set("L"), "wc": set(), "head": set()}
_WHY = {
    "--pre": "runs an external program", "--pre-glob": "runs an external program",
    "--hostname-bin": "runs an external program", "--search-zip": "runs decompression programs",
    "-z": "runs decompression programs", "--follow": "follows symlinks out of the corpus",
    "-L": "follows symlinks out of the corpus", "-R": "follows symlinks out of the corpus",
    "--dereference-recursive": "follows symlinks out of the corpus",
    "--dereference": "follows symlinks out of the corpus", "--files0-from": "reads a list of arbitrary files",
}
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
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        timeout_s: float = 30.0,
        max_output_chars: int = MAX_OUTPUT_CHARS,
        read_window: int = READ_WINDOW_LINES,
    ):
        self.root = Path(os.path.realpath(root))
        if not self.root.is_dir():
            raise FileNotFoundError(f"corpus directory {root} does not exist")
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.read_window = read_window
        self.programs = {name: path for name in ALLOWED_COMMANDS if (path := _locate(name))}
        # The only environment a command sees: no RIPGREP_CONFIG_PATH, GREP_OPTIONS, HOME, ...
        self.env = {"PATH": os.pathsep.join(sorted({str(Path(p).parent) for p in self.programs.values()})), "LC_ALL": "C.UTF-8"}

    # -- paths -----------------------------------------------------------------------------
    def resolve(self, path: str) -> Path:
        """`path` (relative to the corpus, or absolute) resolved with symlinks; must stay inside."""
        if "\x00" in path:
            raise Refused("refused: NUL byte in path")
        resolved = Path(os.path.realpath(os.path.join(self.root, path)))
        if resolved != self.root and self.root not in resolved.parents:
            raise Refused(f"refused: path {path!r} is outside the corpus directory (resolves to {resolved}); only files under the corpus can be read")
        return resolved

    def display(self, path: Path) -> str:
        return "." if path == self.root else str(path.relative_to(self.root))

    # -- read ------------------------------------------------------------------------------
    def read(self, file: str, offset: int = 1) -> str:
        """Lines `offset`.. `offset+window-1` (1-based) of `file`, numbered like `cat -n`."""
        if not isinstance(file, str) or not file:
            raise Refused("read needs a 'file' argument (a path relative to the corpus)")
        try:
            offset = int(offset)
        except (TypeError, ValueError):
            raise Refused(f"read: offset must be a line number, got {offset!r}") from None
        offset = max(offset, 1)
        path = self.resolve(file)
        if not path.is_file():
            raise Refused(f"read: {file!r} is not a file in the corpus (use bash 'ls' or 'find' to list files)")
        with path.open(encoding="utf-8", errors="replace") as handle:
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
        else:
            self._check_flags(program, args)
        for arg in args:  # every argument that could name a path must stay in the corpus
            if arg.startswith("--") and "=" in arg:
                value = arg.split("=", 1)[1]
            elif program in ("rg", "grep") and arg[:1] == "-" and arg[1:2] != "-" and "f" in arg[1:]:
                value = arg[arg.index("f", 1) + 1 :]  # `-nfFILE`: a pattern file glued to its flag
            else:
                value = arg
            if value and not value.startswith("-"):
                self.resolve(value)
        return [self.programs[program], *args]

    def _check_flags(self, program: str, args: list[str]) -> None:
        for arg in args:
            if arg == "--":
                break  # rg/grep: everything after is a pattern or path, checked for confinement
            if arg.startswith("--"):
                name = arg.split("=", 1)[0]
                if name in _REFUSED_LONG[program]:
                    raise Refused(f"refused: {program} {name} is not allowed ({_WHY.get(name, 'unsafe')})")
            elif arg.startswith("-") and len(arg) > 1:
                bad = _REFUSED_SHORT[program] & set(arg[1:])
                if bad:
                    flag = f"-{sorted(bad)[0]}"
                    raise Refused(f"refused: {program} {flag} is not allowed ({_WHY.get(flag, 'unsafe')})")

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
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, cwd=self.root, env=self.env, stdin=asyncio.subprocess.DEVNULL,
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
            text += f"\n[exit status {process.returncode}]"
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
    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call from a model; every problem comes back as readable text."""
        try:
            if name == "read":
                return self.read(arguments.get("file", arguments.get("path", "")), arguments.get("offset", 1))
            if name == "bash":
                return await self.bash(arguments.get("command", ""))
            return f"Error: unknown tool {name!r}; the tools are read and bash"
        except Refused as error:
            return f"Error: {error}"


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
    `question`) or "dci_subagent" (ParSer's DCI reader, user field `query`).
    """

    def __init__(self, sandbox: Sandbox, prompt: str = "dci", version: str = prompts.DEFAULT_VERSION):
        self.sandbox, self.prompt, self.version = sandbox, prompt, version
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
