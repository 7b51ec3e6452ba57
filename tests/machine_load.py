"""A pytest plugin: the run ends with one line saying what the whole machine did meanwhile.

Why: `make test` is held to a wall-time target on a shared 2-core machine, and the same commit
has taken 677 s on one evening and 1,800 s on another. The durations table shows which tests
are slow, not whether the suite grew or the machine slowed down. This line does: the CPU-s
every process on the machine spent (the suite's Ray daemons and subprocesses included, so
also anything else running), the time the hypervisor gave our cores to other guests (steal),
and the idle time, read from /proc/stat at the start and the end of the run. On 2 cores the
wall time can be no less than CPU-s / 2: if busy + steal fill the cores, only fewer CPU-s
make the suite faster; steal is the machine's share. tests/conftest.py loads it; it prints
nothing where /proc/stat does not exist (not Linux) and nothing in xdist's workers.

    .venv/bin/pytest tests/test_machine_load_on_cpu.py -q    # ... machine during the run (2 cores, ...
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

PROC_STAT = Path("/proc/stat")
# the fields of /proc/stat's "cpu" line, in clock ticks (man 5 proc)
FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_start: dict[str, Any] = {}


def read_cpu_seconds(path: Path = PROC_STAT) -> dict[str, float] | None:
    """The machine's cumulative CPU time per field of the "cpu" line, in seconds (None off Linux)."""
    try:
        line = path.read_text().splitlines()[0]
    except OSError:
        return None
    name, *ticks = line.split()
    if name != "cpu" or len(ticks) < len(FIELDS):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    return {field: int(value) / hz for field, value in zip(FIELDS, ticks[:len(FIELDS)], strict=True)}


def summary(start: dict[str, float], end: dict[str, float], wall_s: float, cores: int) -> str:
    spent = {field: end[field] - start[field] for field in FIELDS}
    busy = sum(spent[f] for f in ("user", "nice", "system", "irq", "softirq"))
    return (f"machine during the run ({cores} cores, {wall_s:.0f} s): {busy:.0f} CPU-s busy "
            f"({busy / (cores * wall_s):.0%} of the cores), {spent['steal']:.0f} s stolen by the hypervisor, "
            f"{spent['idle'] + spent['iowait']:.0f} s idle")


def pytest_sessionstart(session: Any) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller reports
        return
    _start.update(stat=read_cpu_seconds(), wall=time.monotonic())


@pytest.hookimpl(trylast=True)  # after the durations table
def pytest_terminal_summary(terminalreporter: Any) -> None:
    end = read_cpu_seconds()
    if _start.get("stat") is None or end is None:
        return
    wall_s = max(time.monotonic() - _start["wall"], 1e-9)
    terminalreporter.write_line(summary(_start["stat"], end, wall_s, os.cpu_count() or 1))
