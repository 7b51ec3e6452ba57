"""`make learn`'s pipeline at smoke size: data -> warm start -> eval -> GRPO -> merged checkpoint
-> eval of the merged weights -> Table 7, curve and summary.json.

    .venv/bin/pytest tests/e2e/test_learn_recipe_on_cpu.py -q -s

Runs `recipes/train_cpu_learn.sh --smoke` (2 GRPO steps of verl's real separate_async trainer,
a 20-step warm start, one eval run on 4 held-out questions). It checks the pipeline, not the
learning: the full run (`make learn`) is judged by its own `--require-learning` (docs/learning.md).
The subagents are the loopback world readers (parser.serving.world_reader), standing in for SGLang.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 2300  # a few minutes on 2 quiet cores; past 1,500 s at load 30-48

# each module's first test builds the runs (trainer launches): the suite's 600 s default is too short
pytestmark = [pytest.mark.timeout(2400), pytest.mark.first(minutes=3.5)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("learn")
    env = {**os.environ, "LEARN_DIR": str(out), "PYTHON": sys.executable, "RAY_DEDUP_LOGS": "0",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("VERL_LOGGING_LEVEL", None)
    # its own process group: past the deadline the trainer and readers it started go with it
    proc = subprocess.Popen([str(REPO / "recipes" / "train_cpu_learn.sh"), "--smoke"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the smoke recipe ran past {TIMEOUT_S} s:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    assert proc.returncode == 0, f"{stdout[-6000:]}\n{stderr[-6000:]}"
    print("\n" + (out / "timings.txt").read_text())
    return out, stdout


def test_summary_has_exactly_the_issue_keys(run):
    out, _ = run
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"steps", "reward_first5", "reward_last5", "heldout_sub_em_before", "heldout_sub_em_after",
                            "heldout_questions", "turns_before", "turns_after"}
    assert summary["steps"] == 2 and summary["heldout_questions"] == 4


def test_table7_and_the_training_curve_are_rendered(run):
    out, stdout = run
    table = (out / "report" / "rl.md").read_text()
    assert "| w/o RL |" in table and "| w/ RL |" in table and "Avg." in table
    assert (out / "report" / "figures" / "training_curve.png").stat().st_size > 1000
    assert "w/ RL" in stdout  # printed, as `make learn` prints it
    steps = [json.loads(line) for line in (out / "train_metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and all("parser/reward/mean" in s["data"] for s in steps)
    assert list((out / "wandb").glob("offline-run-*"))  # wandb logged offline


def test_the_merged_checkpoint_is_the_trained_actor_and_eval_loads_it(run):
    """verl's model merger turned the FSDP checkpoint into Hugging Face weights + tokenizer, equal
    to the actor's (rounded to bfloat16: verl 0.9.1's FSDP merger always writes bf16, see
    docs/learning.md), and eval.run evaluated that directory as the lead."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    out, _ = run
    merged = out / "lead_rl"
    weights = {k: v for f in merged.glob("*.safetensors") for k, v in load_file(f).items()}
    shard = torch.load(out / "checkpoints" / "global_step_2" / "actor" / "model_world_size_1_rank_0.pt",
                       map_location="cpu", weights_only=False)
    actor = {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in shard.items()}
    assert set(weights) <= set(actor) and weights
    for name, tensor in weights.items():
        assert torch.equal(tensor, actor[name].to(tensor.dtype)), name
    before = {k: v for f in (out / "lead").glob("*.safetensors") for k, v in load_file(f).items()}
    assert any(not torch.equal(before[k], weights[k]) for k in weights)  # two GRPO steps moved it
    tokenizer = AutoTokenizer.from_pretrained(merged)
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(out / "lead").get_vocab()
    manifest = json.loads((out / "eval" / "after" / "manifest.json").read_text())
    assert manifest["config"]["models"]["lead"]["model"] == str(merged)
    rows = [json.loads(line) for line in (out / "eval" / "after" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and {r["variant"] for r in rows} == {"w/ RL"}
