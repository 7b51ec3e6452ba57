"""`python -m eval.run method=parser_release` on CPU: the released checkpoint's eval preset composes
and runs end to end, with tiny random-weight Qwen3.5 models in place of the checkpoint.

A real subprocess runs the real engine under `protocol: release`; the release's prose comes from
`support.release_standin`, which stands in for a clone of github.com/cuhk-parser/PARSER
(no network in CI, and the project carries no copy of that text).

    .venv/bin/pytest tests/e2e/test_eval_release_on_cpu.py -q
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from eval.store import RESULTS, read_jsonl
from support.release_standin import write_release_standin

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_parser_release_eval_runs_on_cpu(tmp_path):
    repo = write_release_standin(tmp_path / "PARSER")
    out = tmp_path / "run"
    command = [sys.executable, "-m", "eval.run", "--config-name", "tiny_cpu", "method=parser_release", f"out_dir={out}",
               "runs=1", "dataset.num_questions=2", "dataset.lengths=[50]", "progress=false",
               # CPU budgets for random weights (configs/episode/cpu.yaml's); the rest is the release preset
               "method.episode.max_turns=3", "method.episode.max_tokens_per_turn=64", "method.episode.subagent_max_tokens=32"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PARSER_RELEASE_REPO": str(repo)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = list(read_jsonl(out / RESULTS))
    assert len(rows) == 2
    for row in rows:
        assert row["method"] == "parser_release" and row["row"] == "ParSer (release protocol)"
        assert {"sub_em", "sub_em_release"} <= set(row)
        system, user = row["record"]["messages"][:2]
        assert system["content"].startswith("STAND-IN lead system prompt")  # read from the checkout
        assert user["content"] == f"## Question\n\n{row['question']}\n"
        assert row["record"]["num_chunks"] >= 1 and row["steps"] <= 3
