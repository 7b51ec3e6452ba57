"""Settings no run can honour are refused at load, naming the key or the file, with exit 2:
`concurrency: 0` waited forever, `runs: 0` and an empty dataset file reported "all 0 samples
done" and exited 0. And the order study records a cell whose folder another process holds and
goes on with the others.

    .venv/bin/pytest tests/test_eval_settings_on_cpu.py -q

The method is the outer edge where one is needed (`Recorder`, as in test_eval_resume_on_cpu.py).
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_eval_resume_on_cpu import Recorder, _cfg, _files, _records, _write

from eval.run import BadSetting, evaluate

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("override, key", [("concurrency=0", "concurrency=0"), ("concurrency=-3", "concurrency=-3"),
                                           ("runs=0", "runs=0")])
def test_a_count_below_one_is_refused_naming_the_key(tmp_path, override, key):
    with pytest.raises(BadSetting, match=f"{key}: expected an integer >= 1"):
        asyncio.run(evaluate(_cfg(tmp_path / "out", "limit=1", override), Recorder()))
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing written


def test_an_empty_dataset_file_is_refused_naming_the_file(tmp_path):
    data = tmp_path / "eval_50.jsonl"
    data.write_text("")
    with pytest.raises(BadSetting, match=f"{data}: no samples"):
        asyncio.run(evaluate(_cfg(tmp_path / "out", *_files(data)), Recorder()))
    _write(data, _records(["a"]))  # the same run with a sample in the file goes
    assert asyncio.run(evaluate(_cfg(tmp_path / "out", *_files(data)), Recorder())) == 0


def test_the_command_exits_2_and_says_which_key(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "eval.run", "--config-name", "tiny_cpu", "concurrency=0",
                           f"out_dir={tmp_path / 'out'}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "eval.run: error: concurrency=0: expected an integer >= 1" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_order_study_records_a_locked_cell_and_runs_the_others(tmp_path, capsys):
    """One method on two controlled sets (tiny random models, as order_study_tiny_cpu): the first
    cell's folder is held by another eval.run; the study says so, runs the second, reports, exits 1."""
    from hydra import compose, initialize_config_dir

    from eval.order_study import run_study
    from eval.run import CONFIGS
    from eval.store import RESULTS, lock_run_dir

    method = "{config: memagent_cpu, overrides: ['method.chunk_size=1024', 'method.max_memory_tokens=8', 'method.max_answer_tokens=8']}"
    sets = ("[{config: synthetic_distance, overrides: ['dataset.options.distances=[0,10]', 'dataset.options.pad=3']}, "
            "{config: synthetic_order, overrides: ['dataset.options.length=20']}]")
    base = [f"hydra.searchpath=[file://{CONFIGS}]", f"study.root={tmp_path / 'study'}", f"study.methods=[{method}]",
            f"study.datasets={sets}"]
    with initialize_config_dir(config_dir=str(CONFIGS / "eval"), version_base="1.3"):
        cfg = compose("order_study_tiny_cpu", overrides=base)

        def compose_cell(overrides):
            return compose("order_study_tiny_cpu", overrides=[*base, *overrides])

        locked = compose_cell(["method=memagent_cpu", "dataset=synthetic_distance"]).out_dir
        with lock_run_dir(locked):
            status = asyncio.run(run_study(cfg, compose_cell))
    out = capsys.readouterr().out
    assert status == 1 and "skipped" in out and f"{locked} is in use by another eval.run" in out
    assert not (Path(locked) / RESULTS).exists()
    assert len(list((tmp_path / "study").rglob(RESULTS))) == 1  # the other cell ran
