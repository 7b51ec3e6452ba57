"""The RLM REPL as a sandbox: model-written Python runs in a separate, isolated process, never in ours.

Why: rlms' default `local` environment exec's model code in the host process (`import os`, `open`, a shell),
and in long-document QA the document is the attacker's channel. So `method=rlm` runs its cells here: one
worker process per episode (`repl_worker.py`, started by path behind `parser.engine.sandbox.process`'s
limits shim) that keeps its variables across cells, with no network, no host files, no environment, bounded
memory, CPU, file size and process count, a wall deadline per cell, and death with its parent. What is and
is not blocked, and why: docs/security.md, "RLM REPL". It refuses to start without its isolation unless the
caller sets `allow_unisolated=True` (the method's named unsafe option `sandbox.allow_unisolated`).

Everything the worker sends is untrusted (model code can write to the pipe): messages are bounded
(`ReplLimits.message_bytes`), checked field by field, and a worker that breaks the protocol is killed and
replaced, as at its deadline (`CellResult.lost_state`).

    async def llm(prompts, model):  # the method's sub-call backend; never raises ("Error: ..." replies)
        return [await ask(p) for p in prompts]

    async with await ReplSandbox.start(document, llm=llm) as repl:
        cell = await repl.run("print(len(context)); answer['content'] = llm_query('hi'); answer['ready'] = True")
        cell.stdout, cell.final_answer, cell.sub_calls

Tests: `.venv/bin/pytest tests/test_repl_sandbox_on_cpu.py -q`.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, Awaitable, Callable

from parser.engine.sandbox.process import KILL_GRACE_S, ProcessSlots, kill_group, limited_argv

WORKER = pathlib.Path(__file__).with_name("repl_worker.py")
CONFIG = pathlib.Path(__file__).resolve().parents[3] / "configs" / "sandbox" / "repl.yaml"  # ReplLimits' defaults
STARTUP_TIMEOUT_S = 30.0  # worker start, isolation and loading the context
WORKER_UID_BASE = 1 << 20  # as root the worker drops to WORKER_UID_BASE + its pid: a uid no one else uses

Llm = Callable[[list[str], "str | None"], Awaitable[list[str]]]


class SandboxUnavailable(RuntimeError):
    """The worker could not be started or isolated (the message says which step failed)."""


@dataclasses.dataclass(frozen=True)
class ReplLimits:
    """Every bound of one REPL episode (configs/sandbox/repl.yaml holds these defaults)."""

    cell_timeout_s: float = 120.0  # wall deadline per cell, not counting time the host spends on its sub-calls
    episode_cpu_s: int = 600  # RLIMIT_CPU over the episode: workers replaced after a kill get what is left
    memory_bytes: int = 2 << 30  # RLIMIT_AS of the worker
    file_bytes: int = 64 << 20  # RLIMIT_FSIZE, and the size of the worker's private tmpfs
    processes: int = 32  # RLIMIT_NPROC inside the worker's user namespace: processes and threads (no fork bombs)
    output_chars: int = 20_000  # of stdout and of stderr kept per cell (the method makes rlms' exact cut)
    max_sub_calls_per_cell: int = 256  # prompts one cell may send to `llm`; past it each gets an "Error: ..."
    message_bytes: int = 64 << 20  # largest message the worker may send (a sub-call's prompts)

    def __post_init__(self):
        def check(name: str, ok: bool, domain: str) -> None:
            if not ok:
                raise ValueError(f"sandbox.{name} must be {domain}, got {getattr(self, name)!r}")

        def integer(name: str, least: int) -> None:
            value = getattr(self, name)
            check(name, isinstance(value, int) and not isinstance(value, bool) and value >= least,
                  f"an integer >= {least}")

        timeout = self.cell_timeout_s
        check("cell_timeout_s", isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
              and math.isfinite(timeout) and timeout > 0, "a positive finite number of seconds")
        integer("episode_cpu_s", 1)
        integer("memory_bytes", 64 << 20)
        integer("file_bytes", 1 << 20)
        integer("processes", 4)  # the worker is two processes (the pid namespace's init and its waiter)
        integer("output_chars", 1)
        integer("max_sub_calls_per_cell", 0)
        integer("message_bytes", 1 << 20)


@dataclasses.dataclass(frozen=True)
class SubCall:
    prompts: tuple[str, ...]
    model: str | None
    replies: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class CellResult:
    stdout: str  # the first `output_chars` characters the cell printed
    stderr: str  # as rlms' LocalREPL writes it: what the cell wrote, then "\n{type}: {message}" if it raised
    variables: tuple[str, ...]  # the names rlms' format_execution_result lists, in its order
    final_answer: str | None  # str(answer["content"]) once the cell set answer["ready"] (or rebound a ready dict)
    seconds: float  # wall time of `run`, its sub-calls included
    sub_calls: tuple[SubCall, ...]
    lost_state: bool  # the worker died (deadline, memory, CPU, protocol); a fresh one holds the context again
    stdout_chars: int | None = None  # the whole length when `stdout` was cut (None: `stdout` is whole)
    stderr_chars: int | None = None  # the same for `stderr` (rlms' cut note counts the whole text)


class _Broken(Exception):
    """The worker died or broke the protocol; the message is the one line the cell's stderr gets."""


class ReplSandbox:
    """One episode's REPL. `start` spawns and isolates the worker and loads the context; `run` runs a
    cell; `aclose` kills the worker's process group and removes its directory (idempotent)."""

    def __init__(self, context, llm: Llm, limits: ReplLimits, slots: ProcessSlots | None, allow_unisolated: bool):
        self._context_line = _encode({"context": context})
        self._llm, self.limits, self._slots, self.allow_unisolated = llm, limits, slots, allow_unisolated
        self._process: asyncio.subprocess.Process | None = None
        self._init: int | None = None  # pidfd of the REPL process when it is a pid namespace's init
        self._repl_pid: int | None = None  # the REPL process (the init, or the worker itself unisolated)
        self._directory: str | None = None
        self._slot: asyncio.Semaphore | None = None
        self._cpu_spent = 0.0  # by workers already gone
        self._cpu_now = 0.0  # by the current worker, as the host last read it (never as the worker says)
        self._closed = False
        self._lost: str | None = None  # why the last worker is gone, until a cell's result has said so
        self.missing: tuple[str, ...] = ()  # isolation steps that failed (only with allow_unisolated)

    @classmethod
    async def start(cls, context: str | list | dict, *, llm: Llm, limits: ReplLimits = ReplLimits(),
                    slots: ProcessSlots | None = None, allow_unisolated: bool = False) -> "ReplSandbox":
        if not isinstance(context, (str, list, dict)):
            raise TypeError(f"the REPL context must be a str, list or dict, got {type(context).__name__}")
        sandbox = cls(context, llm, limits, slots, allow_unisolated)
        try:
            if slots is not None:  # one slot for the episode's worker, whichever worker that is
                slot = slots()
                await slot.acquire()
                sandbox._slot = slot
            await sandbox._spawn()
        except _Broken as broken:
            await sandbox.aclose()
            raise SandboxUnavailable(f"the RLM REPL worker did not start: {broken}") from None
        except BaseException:
            await sandbox.aclose()
            raise
        return sandbox

    async def __aenter__(self) -> "ReplSandbox":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    # ------------------------------------------------------------------------------------ the worker
    def _cpu_left(self) -> float:
        return self.limits.episode_cpu_s - self._cpu_spent

    async def _spawn(self) -> None:
        cpu_left = self._cpu_left()
        if cpu_left < 1:
            raise _Broken(f"the episode's CPU budget of {self.limits.episode_cpu_s} s is spent, so no worker runs")
        self._directory = tempfile.mkdtemp(prefix="parser-repl-")
        os.mkdir(os.path.join(self._directory, ".root"))
        settings = {"parent": os.getpid(), "directory": self._directory, "uid_base": WORKER_UID_BASE,
                    "allow_unisolated": self.allow_unisolated, "file_bytes": self.limits.file_bytes,
                    "output_chars": self.limits.output_chars, "message_bytes": self.limits.message_bytes,
                    "processes": self.limits.processes}
        argv = limited_argv([sys.executable, "-I", "-S", "-X", "utf8", str(WORKER), json.dumps(settings)],
                            memory_limit_bytes=self.limits.memory_bytes, cpu_s=math.floor(cpu_left),
                            file_bytes=self.limits.file_bytes)
        self._process = await asyncio.create_subprocess_exec(
            *argv, cwd=self._directory, env={}, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True, limit=self.limits.message_bytes)
        self._cpu_now = 0.0
        try:
            async with asyncio.timeout(STARTUP_TIMEOUT_S):
                await self._handshake()
        except TimeoutError:
            raise _Broken(f"the worker did not start within {STARTUP_TIMEOUT_S:g} s") from None

    async def _handshake(self) -> None:
        kind, ready = await self._receive(("init", "ready"))
        if kind == "init":  # isolated: the pid namespace's init, the REPL itself (see `_stop`)
            if not isinstance(ready, int) or isinstance(ready, bool) or ready <= 0:
                raise _Broken("the worker's init message is malformed")
            self._init, self._repl_pid = os.pidfd_open(ready), ready
            ready = await self._receive("ready")
        missing = ready.get("missing") if isinstance(ready, dict) else None
        if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
            raise _Broken("the worker's ready message is malformed")
        if missing and not self.allow_unisolated:
            raise SandboxUnavailable(
                "the RLM REPL sandbox cannot isolate its worker, so it will not run model-written code: "
                + "; ".join(missing) + ". Run where user namespaces are allowed, or set the unsafe option "
                "sandbox.allow_unisolated=true (the code then reaches this machine's network and files).")
        self.missing = tuple(missing)
        await self._send_line(self._context_line)
        await self._receive("loaded")

    async def _send_line(self, line: bytes) -> None:
        try:
            self._process.stdin.write(line)
            await self._process.stdin.drain()
        except (ConnectionError, RuntimeError) as error:
            raise _Broken(f"the worker stopped reading ({error})") from None

    async def _receive(self, kind: str | tuple[str, ...]) -> tuple[str, Any] | Any:
        """The next message; `kind` is what may come. Returns its body (or (kind, body) for a tuple)."""
        kinds = (kind,) if isinstance(kind, str) else kind
        try:
            line = await self._process.stdout.readline()
        except (ValueError, asyncio.LimitOverrunError):
            raise _Broken(f"the worker sent a message over {self.limits.message_bytes} bytes") from None
        if not line:
            code = await _reaped(self._process)
            raise _Broken(f"the worker died ({_how(code)})")
        try:
            message = json.loads(line)
        except ValueError:
            raise _Broken("the worker sent a line that is not JSON") from None
        if not isinstance(message, dict) or len(message) != 1 or next(iter(message)) not in kinds:
            raise _Broken(f"the worker sent an unexpected message (expected {' or '.join(kinds)})")
        (name, body), = message.items()
        return (name, body) if isinstance(kind, tuple) else body

    async def _stop(self) -> None:
        """Kill the worker and remove its directory. Isolated, the REPL is killed by its pidfd (its pid
        namespace dies with it) and the process the host started reaps it and exits; the process group
        is killed if that does not happen within `KILL_GRACE_S`, and first when there is no namespace."""
        process, directory, init = self._process, self._directory, self._init
        self._process = self._directory = self._init = self._repl_pid = None
        if process is not None:
            self._cpu_spent += self._cpu_now
            if init is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(init, signal.SIGKILL)
                os.close(init)
            else:
                kill_group(process.pid)
            if await _reaped(process) is None:
                kill_group(process.pid)
                await _reaped(process)
        elif init is not None:
            os.close(init)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    # ---------------------------------------------------------------------------------------- cells
    async def run(self, code: str) -> CellResult:
        """Run one cell. A worker that dies (its deadline, memory, CPU, a broken message) is replaced by a
        fresh one holding the context, and the result says `lost_state`. Cancelled: the worker is killed
        before the cancellation goes on."""
        if self._closed:
            raise RuntimeError("the REPL sandbox is closed")
        if not isinstance(code, str):
            raise TypeError(f"a cell is a str of code, got {type(code).__name__}")
        started = time.monotonic()
        sub_calls: list[SubCall] = []
        if self._process is None and self._cpu_left() < 1:
            return CellResult(stdout="", stderr=f"REPL worker lost: the episode's CPU budget of "
                              f"{self.limits.episode_cpu_s} s is spent, so no cell runs", variables=(),
                              final_answer=None, seconds=0.0, sub_calls=(), lost_state=True)
        try:
            try:
                if self._process is None:
                    await self._spawn()
                result = await self._cell(code, started, sub_calls)
            except _Broken as broken:
                return await self._replace(str(broken), started, sub_calls)
        except BaseException as error:  # cancelled, or the llm callback failed: no worker may outlive it
            await self._stop()
            why = "cancelled" if isinstance(error, asyncio.CancelledError) else f"stopped by {type(error).__name__}"
            self._lost = f"REPL worker lost: a cell was {why}; its variables are gone (a new worker holds `context`)"
            raise
        if self._lost is not None:  # the worker this cell ran in replaced one killed by a cancellation
            note = f"{self._lost}\n"
            result = dataclasses.replace(result, lost_state=True, stderr=note + result.stderr, stderr_chars=None
                                         if result.stderr_chars is None else len(note) + result.stderr_chars)
            self._lost = None
        return result

    @property
    def directory(self) -> str | None:
        """The worker's temporary directory on the host (its tmpfs root's mount point); removed at close."""
        return self._directory

    @property
    def pid(self) -> int | None:
        """The worker's process id, which is also its process group's (None between workers)."""
        return None if self._process is None else self._process.pid

    async def _cell(self, code: str, started: float, sub_calls: list[SubCall]) -> CellResult:
        await self._send_line(_encode({"run": code}))
        budget = self.limits.cell_timeout_s  # the cell's own time; sub-calls are the host's
        asked = 0
        while True:
            clock = time.monotonic()
            try:
                kind, body = await asyncio.wait_for(self._receive(("llm", "done")), budget)
            except asyncio.TimeoutError:
                raise _Broken(f"the cell ran past its deadline of {self.limits.cell_timeout_s:g} s "
                              f"and the worker was killed") from None
            budget -= time.monotonic() - clock
            if kind == "done":
                return self._result(body, started, sub_calls)
            prompts, model = _request(body)
            allowed = max(0, self.limits.max_sub_calls_per_cell - asked)
            asked += len(prompts)
            replies = await self._ask(prompts[:allowed], model) if allowed else []
            replies += [f"Error: this cell's sub-calls passed the sandbox's bound of "
                        f"{self.limits.max_sub_calls_per_cell} prompts"] * (len(prompts) - len(replies))
            if allowed:
                sub_calls.append(SubCall(tuple(prompts[:allowed]), model, tuple(replies[:allowed])))
            await self._send_line(_encode({"replies": replies}))

    async def _ask(self, prompts: list[str], model: str | None) -> list[str]:
        replies = await self._llm(prompts, model)
        if not isinstance(replies, list) or len(replies) != len(prompts) or not all(isinstance(r, str) for r in replies):
            raise TypeError(f"the REPL's llm callback must return a list of {len(prompts)} str, got {replies!r:.200}")
        return replies

    def _result(self, body: Any, started: float, sub_calls: list[SubCall]) -> CellResult:
        try:
            stdout, stderr = _text(body, "stdout"), _text(body, "stderr")
            variables = body["variables"]
            final = body["final_answer"]
            lengths = [body["stdout_chars"], body["stderr_chars"]]
            if (not isinstance(variables, list) or not all(isinstance(v, str) for v in variables)
                    or not (final is None or isinstance(final, str))
                    or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in lengths)):
                raise TypeError
        except (KeyError, TypeError):
            raise _Broken("the worker sent a malformed cell result") from None
        self._read_cpu()
        keep = self.limits.output_chars
        (stdout, stdout_chars), (stderr, stderr_chars) = (_kept(text, whole, keep) for text, whole in
                                                          ((stdout, lengths[0]), (stderr, lengths[1])))
        return CellResult(stdout=stdout, stderr=stderr, variables=tuple(variables), final_answer=final,
                          seconds=time.monotonic() - started, sub_calls=tuple(sub_calls), lost_state=False,
                          stdout_chars=stdout_chars, stderr_chars=stderr_chars)

    def _read_cpu(self) -> None:
        """The REPL's CPU seconds (its own and its reaped children's), read by the host from /proc: what a
        worker reports about itself is untrusted."""
        pid = self._repl_pid if self._repl_pid is not None else self._process.pid
        try:
            fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return
        self._cpu_now = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime..cstime

    async def _replace(self, why: str, started: float, sub_calls: list[SubCall]) -> CellResult:
        """The worker is gone: say so in one line and start a fresh one with the context."""
        if self._process is not None and self._process.returncode in _CPU_KILLED:
            self._cpu_now = self.limits.episode_cpu_s  # its CPU limit, which is what the episode had left
        elif self._process is not None and self._process.returncode is None:
            self._read_cpu()  # still running (its deadline, a broken message): as of now, before the kill
        await self._stop()
        line = f"REPL worker lost: {why}; its variables are gone"
        try:
            await self._spawn()
            line += " (a new worker holds `context` again)"
        except _Broken as broken:
            await self._stop()
            line += f"; {broken}"
        return CellResult(stdout="", stderr=line, variables=(), final_answer=None,
                          seconds=time.monotonic() - started, sub_calls=tuple(sub_calls), lost_state=True)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._stop()
        if self._slot is not None:
            self._slot.release()
            self._slot = None


def _encode(message: dict) -> bytes:
    return json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n"


def _kept(text: str, whole: int, keep: int) -> tuple[str, int | None]:
    """At most `keep` characters of `text`, and its whole length if that is more than what is kept."""
    whole = max(whole, len(text))
    return text[:keep], (whole if whole > min(len(text), keep) else None)


def _text(body: Any, key: str) -> str:
    value = body[key]
    if not isinstance(value, str):
        raise TypeError
    return value


def _request(body: Any) -> tuple[list[str], str | None]:
    prompts = body.get("prompts") if isinstance(body, dict) else None
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts) or not (
            model is None or isinstance(model, str)):
        raise _Broken("the worker sent a malformed sub-call")
    return prompts, model


_CPU_KILLED = (-signal.SIGXCPU, 128 + signal.SIGXCPU)  # the worker's exit at RLIMIT_CPU (its own or the kernel's)


async def _reaped(process: asyncio.subprocess.Process) -> int | None:
    with contextlib.suppress(asyncio.TimeoutError):
        return await asyncio.wait_for(process.wait(), KILL_GRACE_S)
    return None


def _how(code: int | None) -> str:
    if code is None:
        return "it could not be reaped"
    if code in _CPU_KILLED:
        return "the episode's CPU limit"
    if code in (-9, 128 + 9):
        return "killed by SIGKILL"
    return f"exit status {code}"
