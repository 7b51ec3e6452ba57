"""`python -m parser.plan` as a user runs it: Hydra config, simulation, table, JSON and plot.

    .venv/bin/pytest tests/e2e/test_plan_command_on_cpu.py -q
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_plan_command_writes_table_and_plot(tmp_path):
    """The documented command, end to end (Hydra config, simulation, table, plot)."""
    out = subprocess.run(
        [sys.executable, "-m", "parser.plan", "workload=eval", "workload.lengths=[56000]", "sweep.gpus=[1,2,4]",
         "cluster.subagent_gpus=2", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| 56,000 | 14 | 2 |" in out.stdout
    # the peers: MemAgent chunks + 1, InfMem 2 x chunks + 1 (12 chunks of 5,000), RLM probe, map + combine, answer
    assert re.search(r"\| 56,000 \| [\d.]+ \[4\] \| [\d.]+ \[13\] \| 12 \| [\d.]+ \[25\] \| 4 \| [\d.]+ \[5\] \|", out.stdout)
    assert (tmp_path / "plan.png").stat().st_size > 10_000 and (tmp_path / "plan.json").exists()
