"""End to end on CPU: Chain-of-Agents in CL-order through `python -m eval.run`, and the whole order
study (`python -m eval.order_study --config-name order_study_tiny_cpu`) down to its table and figure.

Real subprocesses run the real engine on random-weight Qwen3.5 models in process, with the real
all-MiniLM-L6-v2 (its PyPI package) as the chunk-order scorer. Answers are noise, so what is
checked is the pipeline: every cell evaluated, each sequential row read every chunk once in its
order, and the report's spread table and three-panel figure hold a number for every method.

    HF_HUB_OFFLINE=1 .venv/bin/pytest tests/e2e/test_order_study_on_cpu.py -q
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eval.store import RESULTS, read_jsonl

ROOT = Path(__file__).resolve().parents[2]
ROWS = ["ParSer", "MemAgent", "MemAgent (CL-order)", "CoA (document)", "CoA (dense)", "CoA (CL-order)"]
pytestmark = pytest.mark.first(minutes=1.2)  # the order study's grid: minutes


def _run(*args: str, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_eval_run_coa_in_cl_order(tmp_path):
    out = tmp_path / "coa"
    _run("eval.run", "--config-name", "tiny_cpu", "method=coa", "method.order=chow_liu", "method.chunk_size=1024",
         "method.max_summary_tokens=16", "method.max_answer_tokens=8", "dataset.lengths=[50]", "limit=1", "runs=1",
         "progress=false", f"out_dir={out}", timeout=600)
    (row,) = read_jsonl(out / RESULTS)
    record = row["record"]
    assert row["row"] == "CoA (CL-order)" and row["method"] == "coa" and record["order"] == "chow_liu"
    assert sorted(record["reading_order"]) == list(range(record["num_chunks"])) and record["num_chunks"] > 3
    assert record["reading_order"] != list(range(record["num_chunks"]))  # the tree moved the chunks
    assert row["steps"] == record["num_chunks"] + 1  # workers, then the manager


def test_order_study_writes_every_cell_the_spread_table_and_the_figure(tmp_path):
    root = tmp_path / "study"
    done = _run("eval.order_study", "--config-name", "order_study_tiny_cpu", f"study.root={root}", timeout=2400)
    cells = sorted(p.parent.relative_to(root).as_posix() for p in root.rglob(RESULTS))
    assert len(cells) == 6 * 3, cells  # 6 methods x 3 controlled sets
    for cell in cells:
        rows = list(read_jsonl(root / cell / RESULTS))
        assert rows and all(r["condition"] for r in rows)
        for r in rows:
            if "reading_order" in r["record"]:  # the sequential readers
                assert sorted(r["record"]["reading_order"]) == list(range(r["record"]["num_chunks"]))
                assert r["steps"] == r["record"]["num_chunks"] + 1
    report = root / "report"
    table = (report / "sensitivity.md").read_text()
    assert table in done.stdout  # the command prints it
    lines = {line.split(" | ")[1]: line.split(" | ")[2:] for line in table.splitlines() if line.startswith("| tiny-qwen3.5")}
    assert sorted(lines) == sorted(ROWS)
    for values in lines.values():
        spreads = [float(v.strip(" |")) for v in values]
        assert len(spreads) == 3 and all(0 <= v <= 100 and not math.isnan(v) for v in spreads)
    header = table.splitlines()[2]
    assert header.index("position") < header.index("order") < header.index("distance")  # the paper's panels
    assert (report / "figures" / "controlled_sensitivity.png").read_bytes()[:4] == b"\x89PNG"
    reading = (report / "reading.md").read_text()  # when each sequential reader read the evidence
    assert all(f"| {row} |" in reading for row in ROWS if row != "ParSer") and "| ParSer |" not in reading
