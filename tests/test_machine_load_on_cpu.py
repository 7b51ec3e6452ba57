"""The machine-load line that ends `make test` (tests/machine_load.py).

    .venv/bin/pytest tests/test_machine_load_on_cpu.py -q
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from machine_load import FIELDS, read_cpu_seconds, summary

TESTS = Path(__file__).resolve().parent
HZ_LINE = "cpu  {} 0 {} {} {} 0 {} {} 0 0\n"


def test_the_cpu_line_is_read_in_seconds_and_anything_else_is_none(tmp_path):
    hz = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    stat.write_text(HZ_LINE.format(3 * hz, hz, 10 * hz, 0, 0, 2 * hz) + "cpu0  1 2 3 4 5 6 7 8 9 10\n")
    assert read_cpu_seconds(stat) == {"user": 3, "nice": 0, "system": 1, "idle": 10, "iowait": 0, "irq": 0,
                                      "softirq": 0, "steal": 2}
    stat.write_text("intr 1 2 3\n")
    assert read_cpu_seconds(stat) is None
    assert read_cpu_seconds(tmp_path / "missing") is None


def test_the_line_counts_busy_steal_and_idle_against_the_cores():
    zero = dict.fromkeys(FIELDS, 0.0)
    end = {**zero, "user": 1500.0, "system": 150.0, "softirq": 10.0, "steal": 130.0, "idle": 70.0, "iowait": 7.0}
    assert summary(zero, end, wall_s=1000.0, cores=2) == (
        "machine during the run (2 cores, 1000 s): 1660 CPU-s busy (83% of the cores), "
        "130 s stolen by the hypervisor, 77 s idle")


@pytest.mark.skipif(read_cpu_seconds() is None, reason="needs Linux's /proc/stat")
@pytest.mark.slow  # a pytest run with two xdist workers: three fresh processes, ~10 CPU-s
def test_a_parallel_run_prints_the_line_once(pytester, monkeypatch):
    pytester.makeconftest('pytest_plugins = ["machine_load"]\n')
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    pytester.makepyfile(test_one="def test_a():\n    pass\n", test_two="def test_b():\n    pass\n")
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    lines = [line for line in result.outlines if line.startswith("machine during the run (")]
    assert len(lines) == 1 and "CPU-s busy" in lines[0] and "stolen by the hypervisor" in lines[0], result.outlines
