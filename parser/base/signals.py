"""Ctrl-C and SIGTERM stop a command the same way, whatever signal state it was started with.

Why: a shell starts a background job (`parser demo &`, a CI step's `( ... ) &`) with SIGINT
ignored, and Python keeps an inherited SIG_IGN, so such a run never saw Ctrl-C (an interrupted
eval finished every sample). SIGTERM's default ends the process on the spot, so nothing it had
started was stopped: the demo's `parser serve` workers run in their own sessions and outlived it.
Every command that loads models or starts processes runs under `stop_on_signals()`, which
installs both handlers explicitly, never trusting what was inherited:

- SIGINT: Python's own `default_int_handler` (exactly it: `asyncio.run` then cancels its main
  task on Ctrl-C, and the command's `finally` blocks stop what it started);
- SIGTERM: whatever SIGINT's handler is at that moment (asyncio's while a loop runs, else
  KeyboardInterrupt), so `kill PID` unwinds the same path as Ctrl-C and prints the same one line;
- SIGHUP (the terminal closed) the same as SIGTERM, unless it was inherited ignored: `nohup`
  asks for exactly that, and its run must survive the logout. Its default ended the command on
  the spot, leaving the workers it had started (in their own sessions, so no SIGHUP) running.

Cleanup that must run to its end (stopping children, `finishing()`) holds SIGINT, SIGTERM and
SIGHUP until it is done: a second Ctrl-C used to interrupt the wait for the children and skip the
SIGKILL of those that had not stopped. The signal is not lost: it lands when the block ends.

The previous handlers come back on exit (tests call `main()` inside pytest's process). It must
never kill anything itself: stopping children is the job of the code that started them.

    with stop_on_signals():
        asyncio.run(run())      # SIGINT or SIGTERM: KeyboardInterrupt out of here, cleanup done
    with finishing():
        group.stop()            # bounded by its own grace period; a second Ctrl-C lands after it
"""
from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType
from typing import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _like_ctrl_c(signum: int, frame: FrameType | None) -> None:
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread while inside; a no-op off it
    (only the main thread may set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _like_ctrl_c)
    if previous[signal.SIGHUP] is not signal.SIG_IGN:  # nohup's run keeps going after the logout
        signal.signal(signal.SIGHUP, _like_ctrl_c)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: set outside Python, cannot be put back from here
                signal.signal(sig, handler)


@contextlib.contextmanager
def finishing() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP held for the block: one arriving inside is noted, and raised
    again (`signal.raise_signal`, to the handler that was there) when the block ends, so cleanup
    that must run to its end is not cut by a second Ctrl-C; the block needs a deadline of its own.
    Handlers, not the signal mask: a signal sent to the process may be taken by any thread that
    does not block it, and Python runs every handler in the main thread. A no-op off the main
    thread (only it may set handlers); an ignored signal stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in HELD_SIGNALS}
    for sig, handler in previous.items():
        if handler not in (signal.SIG_IGN, None):
            signal.signal(sig, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)
        if held:
            signal.raise_signal(held[0])
