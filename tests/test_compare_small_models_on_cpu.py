"""The small-model comparison reports a model the backends refuse as a row and goes on.

The packaged Gemma 3 270M is a base model: its GGUF carries no chat template, and the comparison
used to die in transformers' apply_chat_template at the first episode, losing the other models'
rows. Here a real tiny Qwen3 saved without its template stands in for it (no hub, seconds).

    .venv/bin/pytest tests/test_compare_small_models_on_cpu.py -q
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parser.backends import load_model_and_tokenizer
from parser.backends.models import build_models

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory) -> Path:
    """tiny-qwen3's weights and tokenizer with no chat template, as a base model ships."""
    path = tmp_path_factory.mktemp("base_model")
    model, tokenizer = load_model_and_tokenizer("tiny-qwen3")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)  # the loaded tokenizer is shared (cached): strip the saved copy
    (path / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_a_role_without_a_chat_template_is_refused_at_build_naming_role_and_model(base_model_dir):
    tiny = {"type": "transformers", "model": "tiny-qwen3"}
    base = {"type": "transformers", "model": str(base_model_dir)}
    with pytest.raises(ValueError, match=f"models.lead: '{base_model_dir}' .*without a chat template"):
        build_models({"lead": base, "subagent": {"same_as": "lead"}})
    with pytest.raises(ValueError, match=f"models.subagent: '{base_model_dir}' .*without a chat template"):
        build_models({"lead": tiny, "subagent": base})
    assert build_models({"lead": tiny}).lead_tokenizer.chat_template


def test_the_comparison_reports_the_unusable_model_and_finishes_the_others(base_model_dir, tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "compare_small_models.py"), "--models", str(base_model_dir),
           "tiny-qwen3", "--questions", "2", "--length", "12", "--out", str(tmp_path)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in done.stdout.splitlines() if line.startswith("| ")}
    assert "unusable: " in rows[str(base_model_dir)] and "without a chat template" in rows[str(base_model_dir)]
    assert rows["tiny-qwen3"].split("|")[2].strip() == "2"  # both samples of the model that runs
    assert (tmp_path / "tiny-qwen3.jsonl").read_text().count("\n") == 2
