"""`parser.base.signals.stop_on_signals`: SIGINT and SIGTERM take Ctrl-C's path, whatever the
process inherited, and the previous handlers come back afterwards.

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


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_both_signals_cancel_the_running_program_even_with_sigint_ignored(sig):
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.splitlines() == ["interrupted ['cleanup ran']", "SIGINT ignored again: True"], err
    assert proc.returncode == 0 and "Traceback" not in err
