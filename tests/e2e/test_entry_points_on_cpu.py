"""Entry points as a user runs them: `--help` lists every composed group, and the trainer refuses
up front on a machine that cannot run the config (no config dump, no Ray).

    .venv/bin/pytest tests/e2e/test_entry_points_on_cpu.py -q
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = "parser.gateway_url=http://127.0.0.1:30000"


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=540)


def test_eval_run_help_lists_the_search_path_groups(tmp_path):
    out = run(["eval.run", "--help"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "method (now parser): " in out.stdout and "backend@models (now qwen35_gateway): " in out.stdout
    assert "episode@method.episode (now eval): " in out.stdout and "== Config ==" in out.stdout


def test_the_trainer_refuses_before_printing_the_config_or_starting_ray(tmp_path):
    pytest.importorskip("verl")
    out = run(["parser.train", "--config-name", "train/parser_4b", GATEWAY], tmp_path)  # no data/ in tmp_path
    assert out.returncode == 2, out.stderr[-2000:]
    assert "cannot run this training config" in out.stderr and "hotpotqa_train.parquet: no such file" in out.stderr
    assert len((out.stdout + out.stderr).splitlines()) < 20 and "ray" not in out.stdout.lower()
