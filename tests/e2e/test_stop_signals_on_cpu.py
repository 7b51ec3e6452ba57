"""SIGINT or SIGTERM stops a command and every process it started: one line, no orphan, even when
the command was started with SIGINT ignored (a shell's background job; Python keeps an inherited
SIG_IGN, so the handlers must be installed explicitly: `parser.base.signals.stop_on_signals`).

Real processes, the tiny offline model, synchronised on the line each command prints at the
moment under test; whether a process is gone is checked by its process group after the command
exits. eval's Ctrl-C (started with SIGINT ignored too) is tests/e2e/test_eval_e2e_on_cpu.py's;
serve's graceful SIGTERM once serving is tests/e2e/test_serve_on_cpu.py's.

    HF_HUB_OFFLINE=1 .venv/bin/pytest tests/e2e/test_stop_signals_on_cpu.py -q
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
STOP_DEADLINE_S = 30  # a deadline, not a target: stopping takes seconds; interpreter exit is slow on a loaded 2-core machine
START_DEADLINE_S = 300


def _sigint_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start(argv: list[str], tmp_path: Path) -> subprocess.Popen:
    """`argv` in its own session (so its group can be checked), SIGINT ignored, stdout a pipe."""
    return subprocess.Popen(argv, cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_sigint_ignored)


def _read_until(proc: subprocess.Popen, prefix: str) -> list[str]:
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith(prefix):
            return lines
    proc.wait(START_DEADLINE_S)
    raise AssertionError(f"exited {proc.returncode} before printing {prefix!r}:\n" + "\n".join(lines) + proc.stderr.read()[-3000:])


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_ctrl_c_while_the_demo_waits_for_its_workers_stops_them_all(tmp_path):
    """The worst moment: both `parser serve` workers started (each in its own session, so a
    terminal's Ctrl-C never reaches them) and loading their model. The demo ends with one line,
    exit 130, and neither worker, nor anything in its group, outlives it."""
    proc = _start([sys.executable, "-m", "parser.cli.demo", "models=tiny_cpu", "workers=2", "num_samples=1", "length=10",
                   f"hydra.run.dir={tmp_path / 'run'}", f"output={tmp_path / 'out.jsonl'}"], tmp_path)
    workers: list[psutil.Process] = []
    try:
        _read_until(proc, "subagents: starting 2 ")
        workers = psutil.Process(proc.pid).children()
        assert len(workers) == 2
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=STOP_DEADLINE_S)
    finally:  # whatever happened, this test leaves no process behind either
        for pgid in [proc.pid, *(worker.pid for worker in workers)]:
            if not _group_gone(pgid):
                os.killpg(pgid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and err.splitlines()[-1] == "parser demo: interrupted; its 2 workers are stopped"
    assert _group_gone(proc.pid)
    assert all(_group_gone(worker.pid) for worker in workers)  # each worker leads its own group


def test_sigterm_while_serve_loads_its_model_ends_it_in_one_line(tmp_path):
    """SIGTERM's default killed `parser serve` silently mid-load; aiohttp's own handlers only
    exist once it listens. Now it is Ctrl-C's path from the first line: one line, exit 130 (or, if
    the load won the race, aiohttp's graceful stop: one line, exit 0)."""
    proc = _start([sys.executable, "-m", "parser.serving.server", "--model", "tiny-qwen3.5", "--port", "0"], tmp_path)
    try:
        _read_until(proc, "parser.serving.server: loading tiny-qwen3.5")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=STOP_DEADLINE_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    last = {130: "parser.serving.server: interrupted before serving", 0: "parser.serving.server: stopped"}
    assert proc.returncode in last and out.splitlines()[-1] == last[proc.returncode], out + err[-3000:]
    assert "Traceback" not in err and _group_gone(proc.pid)
