"""The training recipes compose a valid launch (Hydra `--cfg job`: print the config, start nothing).

    .venv/bin/pytest tests/e2e/test_verl_recipes_on_cpu.py -q

With PARSER_GATEWAY_URL set the recipe skips starting the gateway; `--cfg job` makes
`parser.train` print the composed config and exit before Ray or any GPU is touched, so
this checks every override the script passes against the real config tree.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("size, model", [("4b", "Qwen/Qwen3.5-4B"), ("9b", "Qwen/Qwen3.5-9B")])
def test_recipe_composes(size, model):
    env = dict(os.environ, PARSER_GATEWAY_URL="http://127.0.0.1:39999",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", TRAIN_FILES="/data/train.parquet")
    run = subprocess.run([str(REPO / "recipes" / f"train_parser_{size}.sh"), "--cfg", "job"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    config = yaml.safe_load(run.stdout)
    assert config["actor_rollout_ref"]["model"]["path"] == model
    assert config["parser"]["gateway_url"] == "http://127.0.0.1:39999"
    assert config["data"]["train_files"] == "/data/train.parquet"
    assert config["actor_rollout_ref"]["rollout"]["n_gpus_per_node"] == 4 and config["trainer"]["n_gpus_per_node"] == 2
    assert config["trainer"]["experiment_name"] == f"parser_{size}"


def test_recipes_are_valid_bash():
    for script in sorted((REPO / "recipes").glob("*.sh")):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script


def test_the_launcher_stops_on_a_key_verl_would_ignore(tmp_path):
    """A misspelt key on the command line (`+` lets Hydra add it): refused inside the real
    `parser.train` app, before Ray starts, naming the key."""
    run = subprocess.run([sys.executable, "-m", "parser.train", "--config-name", "train/parser_4b",
                          "parser.gateway_url=http://127.0.0.1:39999", "+actor_rollout_ref.rollout.temprature=0.8",
                          f"hydra.run.dir={tmp_path}"],
                         cwd=REPO, env=dict(os.environ, WANDB_MODE="offline"), capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "not in verl's schema (model_engine=megatron): actor_rollout_ref.rollout.temprature" in run.stderr, run.stderr[-3000:]
    assert "Started a local Ray" not in run.stdout + run.stderr
