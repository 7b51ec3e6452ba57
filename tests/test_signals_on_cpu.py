"""`parser.base.signals.stop_on_signals`: SIGINT, SIGTERM and SIGHUP (the terminal closed) take
Ctrl-C's path, whatever the process inherited (but `nohup`'s ignored SIGHUP), and the previous
handlers come back afterwards; `finishing` holds them until a cleanup block ends.

A real child process started as a shell starts a background job (SIGINT ignored), running an
asyncio program that prints a readiness line and waits; the signal is sent after that line. The
commands themselves (demo, serve, eval) are tests/e2e/test_stop_signals_on_cpu.py and
tests/e2e/test_eval_e2e_on_cpu.py.

    .venv/bin/pytest tests/test_signals_on_cpu.py -q
"""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = """
import asyncio, signal
from parser.base.signals import stop_on_signals

cleaned = []

async def main():
    try:
        print("ready", flush=True)
        await asyncio.sleep(60)
    finally:  # what a command's cleanup (stopping its workers, closing its session) stands for
        cleaned.append("cleanup ran")

try:
    with stop_on_signals():
        asyncio.run(main())
except KeyboardInterrupt:
    print("interrupted", cleaned, flush=True)
print("SIGINT ignored again:", signal.getsignal(signal.SIGINT) is signal.SIG_IGN, flush=True)
"""


def _started_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_both_signals_cancel_the_running_program_even_with_sigint_ignored(sig):
    # a program started from a terminal: SIGHUP at its default, whatever this test run inherited (a
    # suite started under `nohup` passed its ignored SIGHUP on, which stop_on_signals rightly keeps)
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_started_from_a_terminal)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.splitlines() == ["interrupted ['cleanup ran']", "SIGINT ignored again: True"], err
    assert proc.returncode == 0 and "Traceback" not in err


def test_nohups_ignored_sighup_stays_ignored_and_a_hangup_otherwise_stops():
    """In this process (main thread): `nohup` starts a run with SIGHUP ignored so that it outlives
    the logout; without it, a hangup takes Ctrl-C's path (its default killed the command on the
    spot and left the workers it had started running)."""
    from parser.base.signals import stop_on_signals

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_on_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        with stop_on_signals():
            assert callable(signal.getsignal(signal.SIGHUP))
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_second_signal_during_cleanup_lands_after_it():
    """`finishing` (around ProcessGroup.stop): a Ctrl-C or SIGTERM sent while children are being
    stopped does not cut the stop short; it is delivered, as Ctrl-C, once the block has ended."""
    import os

    from parser.base.signals import finishing, stop_on_signals

    import threading
    import time

    steps, done = [], threading.Event()
    other = threading.Thread(target=done.wait)  # a thread the kernel may hand the signal to (torch's, aiohttp's)
    other.start()
    with stop_on_signals():
        try:
            with finishing():
                os.kill(os.getpid(), signal.SIGTERM)  # the second signal: the first is what began the cleanup
                signal.pthread_kill(other.ident, signal.SIGINT)  # taken by another thread: a signal mask held nothing
                time.sleep(0.05)  # the cleanup's own work (a wait for the workers), during which the signals arrive
                steps.append("the cleanup ran to its end")
            steps.append("not reached")
        except KeyboardInterrupt:
            steps.append("interrupted after it")
    done.set()
    other.join()
    assert steps == ["the cleanup ran to its end", "interrupted after it"]
