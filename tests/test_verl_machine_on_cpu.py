"""`parser.train` refuses up front on a machine that cannot run the config, and says where a
finished run left its checkpoint and what to run next (parser/train/machine.py).

This machine is the test: a CPU-only torch, no megatron-core, no sglang. A paper config must be
refused with each of those named; the CPU configs must pass once their files exist.

    .venv/bin/pytest tests/test_verl_machine_on_cpu.py -q
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytest.importorskip("verl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hydra import compose, initialize_config_dir  # noqa: E402

from parser.train.machine import MachineError, check_machine, closing_lines, importable, machine_problems  # noqa: E402
from parser.train.train import CONFIG_DIR, prepare  # noqa: E402  (the launcher itself: tests/e2e/test_entry_points_on_cpu.py)

REPO = Path(__file__).resolve().parent.parent  # the checkout: its recipes/
GATEWAY = "parser.gateway_url=http://127.0.0.1:30000"
DATA = CONFIG_DIR / "data"


def composed(name: str, overrides: list[str] = ()):  # type: ignore[assignment]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return prepare(compose(config_name=name, overrides=[GATEWAY, *overrides]))


@pytest.mark.skipif(importable("megatron.core") or importable("sglang"), reason="this machine has the GPU stack")
def test_the_paper_config_is_refused_on_this_cpu_machine_with_everything_it_lacks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data/ here
    config = composed("train/parser_4b")
    problems = machine_problems(config, DATA, gpus=lambda: 0)
    text = "\n".join(problems)
    assert "no CUDA GPU" in text and "recipes/train_cpu_smoke.sh" in text
    assert "megatron.core is not importable" in text and "sglang is not importable" in text
    assert "data.train_files=data/train/hotpotqa_train.parquet: no such file" in text
    assert "--config-name hotpotqa_val" in text  # the command that writes the missing file
    with pytest.raises(MachineError):
        check_machine(config, DATA)  # the real probes: torch here is CPU-only


def test_a_gpu_node_with_too_few_gpus_is_told_how_many_the_config_asks_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    problems = machine_problems(composed("train/parser_4b"), DATA, gpus=lambda: 4, has_module=lambda m: True)
    assert any(p.startswith("6 GPUs needed on this node") and "4 visible" in p for p in problems), problems
    (tmp_path / "data" / "train").mkdir(parents=True)
    for name in ("hotpotqa_train", "hotpotqa_val"):
        (tmp_path / "data" / "train" / f"{name}.parquet").write_bytes(b"")
    assert machine_problems(composed("train/parser_4b"), DATA, gpus=lambda: 8, has_module=lambda m: True) == []


def test_the_cpu_smoke_config_passes_once_its_files_exist(tmp_path):
    files = [f"data.train_files={tmp_path / 't.parquet'}", f"data.val_files={tmp_path / 'v.parquet'}",
             "actor_rollout_ref.model.path=/m"]
    config = composed("train/cpu_smoke", files)
    assert [p.split(":")[0] for p in machine_problems(config, DATA)] == [
        f"data.train_files={tmp_path / 't.parquet'}", f"data.val_files={tmp_path / 'v.parquet'}"]
    (tmp_path / "t.parquet").write_bytes(b"")
    (tmp_path / "v.parquet").write_bytes(b"")
    check_machine(config, DATA)  # no GPU, no megatron: the CPU engine needs neither


def test_a_finished_run_says_where_its_checkpoint_is_and_what_to_run_next(tmp_path):
    config = composed("train/cpu_smoke", ["data.train_files=/t", "data.val_files=/v", "actor_rollout_ref.model.path=/m",
                                          f"trainer.default_local_dir={tmp_path}"])
    assert "no checkpoint under" in closing_lines(config)[0]
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    lines = closing_lines(config)
    assert f"checkpoint at {tmp_path}/global_step_2/actor" in lines[0]
    assert f"verl.model_merger merge --backend fsdp --local_dir {tmp_path}/global_step_2/actor" in lines[1]
    assert f"parser eval --config-name tiny_cpu models.lead.model={tmp_path}/global_step_2/hf" in lines[2]
    paper = composed("train/parser_4b", [f"trainer.default_local_dir={tmp_path}"])
    assert "--backend megatron" in closing_lines(paper)[1] and "--config-name" not in closing_lines(paper)[2]


def test_every_recipe_ends_by_saying_where_the_checkpoint_is():
    """A recipe's last command is the trainer (which prints closing_lines) or it echoes the checkpoint."""
    for recipe in sorted((REPO / "recipes").glob("*.sh")):
        text = recipe.read_text()
        if "exec " in text and "train_parser.sh" in text:  # the 4b / 9b wrappers
            continue
        commands = [c for c in re.split(r"\n(?=\S)", text.strip()) if not c.startswith("#")]
        last = "\n".join(commands[-3:])
        assert re.search(r'(parser|PARSER\[@\]}")[. ]train --config-name', commands[-1]) or ("checkpoint" in last and "next" in last), recipe.name
