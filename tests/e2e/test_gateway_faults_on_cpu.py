"""scripts/gateway_faults.py (the router fault table) at its `--smoke` size, as a real subprocess:
smg and the client-side WorkerPool, a killed worker and a garbage-answering one. The script
itself fails on nonsense (a missing row, a fault that never reached the worker, NaN figures);
here the rows must also say what docs/scaling.md's table says about these two faults.

    .venv/bin/pytest tests/e2e/test_gateway_faults_on_cpu.py -q -s
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_fault_table_smoke(tmp_path):
    out = tmp_path / "faults.json"
    # a 1 s shutdown grace: smg 1.13 pauses min(grace / 2, 5 s) on SIGTERM even when idle, once per smg row
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gateway_faults.py"), "--smoke", "--json", str(out),
                           "--log-dir", str(tmp_path), "--set", "shutdown_grace_period_secs=1"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=300)
    print(done.stdout[-3000:])
    assert done.returncode == 0, f"gateway_faults.py --smoke failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    rows = {(r["fault"], r["setup"]): r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {("kill", "smg"), ("kill", "pool"), ("garbage", "smg"), ("garbage", "pool")}
    assert rows["kill", "smg"]["lost"] == 0 and rows["kill", "pool"]["lost"] == 0
    assert rows["garbage", "smg"]["lost"] > 0 and rows["garbage", "smg"]["who"] == "nobody"  # passes through smg
    assert rows["garbage", "pool"]["lost"] == 0 and rows["garbage", "pool"]["moved"] == 1.0
