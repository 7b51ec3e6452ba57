"""Every benchmark under scripts/bench_*.py runs at its `--smoke` size, so none can silently rot.

The benchmarks print figures as ratios against a baseline measured in the same run; here only
their `--smoke` sizes run (seconds each), as real subprocesses, and must exit 0 and print their
ratio lines. A new benchmark without `--smoke` fails `test_every_bench_has_a_smoke_size`.

    .venv/bin/pytest tests/e2e/test_benchmarks_smoke_on_cpu.py -q
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted(p.name for p in (ROOT / "scripts").glob("bench_*.py"))
# what each bench's output must contain: the same-run comparison it exists to print
EXPECT = {
    "bench_backend.py": "batched/serial at T=",
    "bench_chunking.py": "ratio",
    "bench_data.py": "speed-up:",
    "bench_grammar.py": "ratio",
    "bench_latency.py": "critical-path ratio",  # and it exits 1 on a missing row or a nonsense figure
    "bench_parsers.py": "ratio",
    "bench_scatter.py": "ratio",
}


def test_every_bench_has_a_smoke_size():
    assert BENCHES and all("--smoke" in (ROOT / "scripts" / b).read_text() for b in BENCHES)
    assert set(EXPECT) == set(BENCHES), "add the new benchmark's expected output line to EXPECT"


@pytest.mark.parametrize("bench", BENCHES)
def test_bench_smoke_runs(bench, tmp_path):
    args = [sys.executable, str(ROOT / "scripts" / bench), "--smoke"]
    if bench == "bench_latency.py":
        args += ["--out", str(tmp_path / "bench")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{bench} --smoke failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert EXPECT[bench] in done.stdout, f"{bench} --smoke printed no comparison:\n{done.stdout[-3000:]}"
