"""Running one sandboxed command: kernel limits, a deadline that always holds, no orphans.

Why a module of its own: `parser.engine.sandbox.tools` decides *what* may run; this decides *how* it runs, and
every way that used to go wrong is here. A command that was still printing at its deadline
hung the caller for ever (the reader stopped, so the killed process's pipe never reached its
end); a command's children kept the pipe open after their parent was killed; a cancelled
episode or a killed eval left its searches running. So:

* the output is always read as it arrives, by a protocol that never pauses the pipe, and kept
  as a bounded tail (memory stays at 2 x `keep_bytes`, however much is printed);
* at the deadline the command's whole process group is killed (it leads its own session), and
  `run_limited` returns at most `KILL_GRACE_S` later even if something still holds the pipe;
* cancelled, it kills the group before re-raising; and the command dies with the process that
  started it (`PR_SET_PDEATHSIG`, set by the shim before exec);
* `ProcessSlots` bounds how many commands run at once across every sandbox that shares it.

This module never runs a shell: `argv` is exec'd as it is, behind a Python shim that sets the
limits (`preexec_fn` is unsafe in a process with threads).

    done = await run_limited(["/usr/bin/grep", "-rn", "x", "."], cwd=root, env=env, timeout_s=30,
                             memory_limit_bytes=1 << 30, keep_bytes=160_000)
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import signal
import sys
import weakref
from typing import Mapping

KILL_GRACE_S = 2.0  # after the deadline: how long the killed group may take to close its output
# Runs before the tool (same process, via exec): die with the parent (a killed eval must not
# leave searches behind), set the limits, then become the tool.
_LIMITS_SHIM = (
    "import os, resource as r, sys\n"
    "memory, cpu, fsize, parent = (int(a) for a in sys.argv[1:5])\n"
    "if sys.platform.startswith('linux'):\n"
    "    import ctypes, signal\n"
    "    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != parent:\n"  # the parent died before the line above
    "    os._exit(137)\n"
    "r.setrlimit(r.RLIMIT_AS, (memory, memory))\n"
    "r.setrlimit(r.RLIMIT_CPU, (cpu, cpu + 1))\n"
    "r.setrlimit(r.RLIMIT_FSIZE, (fsize, fsize))\n"
    "r.setrlimit(r.RLIMIT_CORE, (0, 0))\n"
    "os.execv(sys.argv[5], sys.argv[5:])\n"
)


def limited_argv(argv: list[str], *, memory_limit_bytes: int, cpu_s: int, file_bytes: int = 0) -> list[str]:
    """`argv` behind the limits shim: address space, CPU seconds (SIGXCPU at `cpu_s`, SIGKILL a
    second later), largest file it may write (0: none), no core dumps, and death with this process.
    Shared by the DCI commands (`run_limited`) and the RLM REPL worker (`parser.engine.sandbox.repl`)."""
    limits = (memory_limit_bytes, cpu_s, file_bytes, os.getpid())
    return [sys.executable, "-I", "-S", "-c", _LIMITS_SHIM, *(str(int(v)) for v in limits), *argv]


class ProcessSlots:
    """At most `limit` sandbox commands running at once, across every Sandbox that shares this
    object (a method or reader shares one over all its corpora). One asyncio semaphore per event
    loop, since a semaphore belongs to the loop that first waits on it."""

    def __init__(self, limit: int):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"sandbox.max_processes must be a positive integer, got {limit!r}")
        self.limit = limit
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()

    def __call__(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._semaphores:
            self._semaphores[loop] = asyncio.Semaphore(self.limit)
        return self._semaphores[loop]


class _Collector(asyncio.SubprocessProtocol):
    """A command's output as it arrives, always read (never paused, so a killed command's
    pipe always reaches its end) and kept as a bounded tail: memory stays at 2 x `keep`."""

    def __init__(self, keep: int):
        self.keep, self.total, self.tail = keep, 0, bytearray()
        self.finished = asyncio.get_running_loop().create_future()  # process exited and pipes closed

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.total += len(data)
        self.tail.extend(data)
        if len(self.tail) > 2 * self.keep:
            del self.tail[: len(self.tail) - self.keep]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self.finished.set_result(None)


def kill_group(pid: int) -> None:
    """SIGKILL the command's whole process group (it leads its own session)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclasses.dataclass
class Finished:
    """What one command left: the tail of its output, how much it printed, how it ended."""

    output: bytes
    total_bytes: int
    returncode: int | None  # negative: the signal that killed it; None: it could not be reaped in time
    timed_out: bool


async def run_limited(argv: list[str], *, cwd: str | os.PathLike[str], env: Mapping[str, str], timeout_s: float,
                      memory_limit_bytes: int, keep_bytes: int) -> Finished:
    """Run `argv` under the limits (address space, CPU seconds = timeout + 1, no file writes);
    return by `timeout_s + KILL_GRACE_S` whatever the command does. Raises OSError/ValueError if
    it cannot be started."""
    loop = asyncio.get_running_loop()
    limited = limited_argv(argv, memory_limit_bytes=memory_limit_bytes, cpu_s=math.ceil(timeout_s) + 1)
    transport, collector = await loop.subprocess_exec(
        lambda: _Collector(keep_bytes), *limited, cwd=cwd, env=dict(env),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    pid = transport.get_pid()
    timed_out = False
    try:
        done, _ = await asyncio.wait({collector.finished}, timeout=timeout_s)
        if not done:
            timed_out = True
            kill_group(pid)
            await asyncio.wait({collector.finished}, timeout=KILL_GRACE_S)
    finally:
        if not collector.finished.done():
            kill_group(pid)
        transport.close()
    return Finished(bytes(collector.tail[-keep_bytes:]), collector.total, transport.get_returncode(), timed_out)
