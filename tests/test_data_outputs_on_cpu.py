"""Outputs: verl parquet through verl's RLHFDataset, atomic/resumable files, the knowledge
filter through real backends, and every shipped data config.

    .venv/bin/pytest tests/test_data_outputs_on_cpu.py -q
"""
from __future__ import annotations

import asyncio
import inspect
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from data_prep import build_synthetic_eval, recipes
from data_prep.build import run
from parser.records.jsonl import JsonlStore, write_json
from data_prep.knowledge_filter import parametric_filter
from data_prep.verl_parquet import AGENT_NAME, write_rl_parquet
from parser.base.instantiate import locate
from parser.serving.types import SamplingParams
from scripted_lead import ScriptedModel

CONFIGS = Path(__file__).parents[1] / "configs" / "data"


@pytest.fixture(scope="module")
def rows():
    return build_synthetic_eval(num_questions=6, lengths=(30,), seed=0)


def test_verl_parquet_loads_with_rlhf_dataset(tmp_path, rows, qwen3_tokenizer):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    path = write_rl_parquet(tmp_path / "train.parquet", rows, data_source="synthetic")
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 256, "filter_overlong_prompts": True,
                               "filter_overlong_prompts_workers": 1, "truncation": "error", "cache_dir": str(tmp_path / "cache")})
    ds = RLHFDataset(data_files=str(path), tokenizer=qwen3_tokenizer, config=config)
    assert len(ds) == len(rows), "every prompt is short: it holds the question only"
    for i, row in enumerate(rows):
        item = ds[i]
        assert item["raw_prompt"] == [{"role": "user", "content": row["question"]}]
        assert all(row["context"][:200] not in m["content"] for m in item["raw_prompt"]), "the lead never sees the document"
        assert item["agent_name"] == AGENT_NAME
        assert item["extra_info"]["context"] == row["context"]
        assert list(item["reward_model"]["ground_truth"]) == row["answers"]
        assert item["index"] == row["index"] and item["data_source"] == "synthetic"


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    target = tmp_path / "eval_50.json"
    write_json(target, [1, 2])
    with pytest.raises(TypeError):
        write_json(target, [object()])
    assert json.loads(target.read_text()) == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["eval_50.json"]


def test_jsonl_log_cuts_a_torn_last_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"id": "a", "x": 1}\n{"id": "b", "x"')
    log = JsonlStore(path, key=lambda row: row["id"])
    assert "a" in log and "b" not in log
    log.append({"id": "b", "x": 2})
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["a", "b"]


def knowing(known: dict[str, str]) -> ScriptedModel:
    """The outer edge only: a model that knows some answers (the rest it boxes as unknown)."""
    return ScriptedModel(lambda text, _: next((f"\\boxed{{{a}}}" for q, a in known.items() if q in text), "\\boxed{unknown}"))


def test_knowledge_filter_drops_known_and_resumes(tmp_path, rows, tiny_tokenizer):
    questions = [{"id": r["id"], "question": r["question"], "answers": r["answers"]} for r in rows]
    model = knowing({rows[1]["question"]: rows[1]["answers"][0]})
    log_path = tmp_path / "filter.jsonl"
    result = asyncio.run(parametric_filter(questions[:4], model, tiny_tokenizer, log_path=log_path, samples=3, concurrency=2))
    assert model.calls == 12
    assert [result[q["id"]]["answerable"] for q in questions[:4]] == [False, True, False, False]
    assert "<|im_start|>user" in model.prompts[0] and rows[0]["context"][:100] not in model.prompts[0], "question only, chat template"
    again = knowing({})
    result = asyncio.run(parametric_filter(questions, again, tiny_tokenizer, log_path=log_path, samples=3))
    assert again.calls == 3 * 2, "only the two new questions are asked"
    assert result[questions[1]["id"]]["answerable"] and len(log_path.read_text().splitlines()) == 6


def test_knowledge_filter_runs_on_the_in_process_backend(tmp_path, rows, request):
    pytest.importorskip("parser.serving.backends.transformers")
    backend, tokenizer = request.getfixturevalue("tiny_backend"), request.getfixturevalue("tiny_tokenizer")
    questions = [{"id": r["id"], "question": r["question"], "answers": r["answers"]} for r in rows[:2]]
    result = asyncio.run(parametric_filter(questions, backend, tokenizer, log_path=tmp_path / "f.jsonl", samples=2,
                                           sampling=SamplingParams(max_new_tokens=8, temperature=1.0), concurrency=4))
    assert all(len(result[q["id"]]["responses"]) == 2 for q in questions)


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.yaml") if not p.stem.startswith("ruler")))
def test_every_data_config_composes_and_fits_its_recipe(name):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name=name), resolve=True)
    cfg.pop("hydra", None)
    recipe = locate(cfg.pop("_target_"), where=name)
    cfg.pop("tokenizer", None)
    inspect.signature(recipe).bind(**cfg)  # every key is an argument of the recipe
    if "source" in cfg:
        source = dict(cfg["source"])
        inspect.signature(recipes.load_source).bind(**source)


def test_synthetic_config_runs_end_to_end(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="synthetic_eval", overrides=[f"out_dir={tmp_path}", "lengths=[20,40]", "num_questions=3",
                                                               "source.num_questions=3", "source.num_paragraphs=300"])
    cfg = OmegaConf.to_container(cfg, resolve=True)
    cfg.pop("hydra", None)
    out = run(cfg)
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["eval_20.json", "eval_20.json.card.json", "eval_40.json", "eval_40.json.card.json"]
    assert len(json.loads(out[40].read_text())) == 3


def test_train_set_recipe_with_filter_on_the_tiny_model(tmp_path):
    pytest.importorskip("parser.serving.backends.transformers")
    import pyarrow.parquet as pq

    path = recipes.train_set(
        source={"name": "synthetic", "num_questions": 8, "seed": 3, "num_paragraphs": 400}, out_dir=str(tmp_path),
        name="syn_train", length=30, keep=5, knowledge_filter={
            "backend": {"_target_": "parser.serving.backends.transformers.TransformersBackend.from_config", "model": "tiny-qwen3.5"}, "samples": 1, "concurrency": 4,
            "sampling": {"max_new_tokens": 4}})
    table = pq.read_table(path).to_pylist()
    card = json.loads(Path(str(path) + ".card.json").read_text())
    assert card["counts"]["filter_asked"] == 8 and card["counts"]["filter_kept"] + card["counts"]["filter_dropped"] == 8
    assert len(table) == min(5, card["counts"]["filter_kept"])
    assert all(r["extra_info"]["num_docs"] == 30 and r["agent_name"] == AGENT_NAME for r in table)
    assert len((tmp_path / "syn_train.filter.jsonl").read_text().splitlines()) == 8
