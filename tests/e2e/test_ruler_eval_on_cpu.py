"""RULER scoring and report: hand-worked scores, run-averaged cells, the heat map; and a CPU
eval (`python -m eval.ruler --config-name ruler_tiny_cpu`) with tiny in-process models on two
small lengths that must end in the heat map and table.

    HF_HUB_OFFLINE=1 .venv/bin/pytest tests/e2e/test_ruler_eval_on_cpu.py -q
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eval.ruler import build_ruler_report, ruler_score, string_match_all, task_of
from eval.store import RESULTS, read_jsonl
from parser.serving.backends import TRANSFORMERS

ROOT = Path(__file__).resolve().parents[2]


def test_string_match_all_hand_worked():
    golds = ["1234567", "7654321", "1111111"]
    assert string_match_all("The numbers are 1234567 and 7654321.", golds) == pytest.approx(2 / 3)
    assert string_match_all("vhymek, LVZQPK and hcxmfv", ["vhymek", "lvzqpk", "hcxmfv"]) == 1.0  # case-insensitive
    assert string_match_all("12345", ["1234567"]) == 0.0  # a gold must occur whole
    assert string_match_all(None, golds) == 0.0
    assert string_match_all("", golds) == 0.0


def test_ruler_score_dispatches_by_task():
    # Non-QA: partial credit, as RULER's string_match_all.
    assert ruler_score("niah_multivalue", "2834070 and 6971212", ["2834070", "3971783", "6971212", "2959609"]) == 0.5
    assert ruler_score("vt", "VAR abcde, FGHIJ", ["ABCDE", "FGHIJ", "KLMNO", "PQRST", "UVWXY"]) == pytest.approx(0.4)
    # QA: Sub_EM (normalized, either string inside the other), all golds or the first only.
    assert ruler_score("qa_1", "It was Reketh Hefeirk.", ["reketh hefeirk"]) == 1.0
    assert ruler_score("qa_1", "Paris", ["Paris, France"]) == 1.0
    assert ruler_score("qa_1", "the answer is Paris", ["London", "Paris"]) == 1.0
    assert ruler_score("qa_1", "the answer is Paris", ["London", "Paris"], qa_golds="first") == 0.0
    assert ruler_score("qa_1", None, ["Paris"]) == 0.0
    assert task_of("ruler_niah_single_1") == "niah_single_1"
    with pytest.raises(KeyError, match="unknown RULER task"):
        task_of("ruler_nope")


def _row(task, length, run, sid, prediction, answers):
    return {"dataset": f"ruler_{task}", "length": length, "run": run, "sample_id": str(sid), "prediction": prediction,
            "answers": answers, "row": "ParSer", "backbone": "Qwen3.5-4B", "sub_em": 0.0}


def test_report_cells_are_run_averaged_and_drawn(tmp_path):
    rows = {
        "vt": [_row("vt", 8192, 0, 0, "AAAAA BBBBB", ["AAAAA", "BBBBB", "CCCCC", "DDDDD", "EEEEE"]),  # 0.4
               _row("vt", 8192, 0, 1, "nothing", ["FFFFF"]),                                       # 0.0
               _row("vt", 8192, 1, 0, "FFFFF", ["FFFFF"]),                                         # 1.0
               _row("vt", 16384, 0, 0, "GGGGG", ["GGGGG"])],                                       # 1.0
        "niah_single_1": [_row("niah_single_1", 8192, 0, 0, "It is 1234567.", ["1234567"]),
                          _row("niah_single_1", 16384, 0, 0, None, ["7654321"])],
    }
    for task, task_rows in rows.items():
        (tmp_path / "run" / task).mkdir(parents=True)
        (tmp_path / "run" / task / RESULTS).write_text("".join(json.dumps(r) + "\n" for r in task_rows))
    (tmp_path / "run" / "other").mkdir()  # a non-RULER run beside them is ignored
    (tmp_path / "run" / "other" / RESULTS).write_text(json.dumps({**_row("vt", 1, 0, 0, "x", ["x"]), "dataset": "hotpotqa"}) + "\n")

    report = build_ruler_report([tmp_path / "run"], tmp_path / "out")
    cells = report["table"]["Qwen3.5-4B / ParSer"]
    # vt @ 8K: run 0 mean (0.4 + 0) / 2 = 20 %, run 1 = 100 %, mean over runs 60 % (not 46.7 by sample).
    assert cells["vt"][8192]["value"] == pytest.approx(60.0)
    assert cells["vt"][8192]["runs"] == 2 and cells["vt"][8192]["samples"] == 3
    assert cells["vt"][16384]["value"] == 100.0
    assert cells["niah_single_1"][8192]["value"] == 100.0 and cells["niah_single_1"][16384]["value"] == 0.0
    assert report["rows"] == 6
    table = (tmp_path / "out" / "ruler_table.md").read_text()
    assert "| S-NIAH-1 | 100.0 | 0.0 | 50.0 |" in table and "| VT | 60.0 | 100.0 | 80.0 |" in table
    assert "| Avg. | 80.0 | 50.0 |" in table
    png = (tmp_path / "out" / "ruler_heatmap.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    saved = json.loads((tmp_path / "out" / "ruler_scores.json").read_text())
    assert saved["table"]["Qwen3.5-4B / ParSer"]["vt"]["8192"]["value"] == pytest.approx(60.0)


def test_report_without_ruler_rows_says_so(tmp_path):
    (tmp_path / RESULTS).write_text(json.dumps({**_row("vt", 1, 0, 0, "x", ["x"]), "dataset": "hotpotqa"}) + "\n")
    with pytest.raises(ValueError, match="no RULER rows"):
        build_ruler_report([tmp_path], tmp_path / "out")


def test_shipped_configs_compose():
    from hydra import compose, initialize_config_dir

    hydra_path = [f"hydra.searchpath=[file://{ROOT / 'configs'}]"]
    with initialize_config_dir(config_dir=str(ROOT / "configs" / "eval"), version_base="1.3"):
        full = compose(config_name="ruler", overrides=hydra_path)
        tiny = compose(config_name="ruler_tiny_cpu", overrides=hydra_path)
    assert full.method.episode.chunk_size == 8192 and len(full.ruler.tasks) == 10
    assert list(full.ruler.lengths) == [8192, 16384, 32768, 65536, 131072, 262144, 524288]
    assert tiny.models.lead._target_ == TRANSFORMERS and tiny.ruler.generate_missing
    with initialize_config_dir(config_dir=str(ROOT / "configs" / "data"), version_base="1.3"):
        data = compose(config_name="ruler")
    assert list(data.tasks) == list(full.ruler.tasks) and data.num_samples == 128


def test_cpu_eval_on_two_small_lengths_draws_the_heat_map(tmp_path):
    tasks, lengths = ["niah_multikey_2", "fwe"], [1024, 2048]
    cmd = [sys.executable, "-m", "eval.ruler", "--config-name", "ruler_tiny_cpu", f"ruler.tasks=[{','.join(tasks)}]",
           f"ruler.lengths=[{','.join(map(str, lengths))}]", f"ruler.data_dir={tmp_path / 'data'}",
           f"out_dir={tmp_path / 'out'}", "limit=2", "progress=false"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for task in tasks:
        rows = list(read_jsonl(tmp_path / "out" / task / RESULTS))
        assert sorted((r["length"], r["sample_id"]) for r in rows) == [(L, s) for L in lengths for s in ("0", "1")]
        assert all(r["dataset"] == f"ruler_{task}" and r["record"]["num_chunks"] >= 1 for r in rows)
        for L in lengths:
            assert (tmp_path / "data" / f"eval_{task}_{L}.json.card.json").exists()
    assert (tmp_path / "out" / "report" / "ruler_heatmap.png").read_bytes()[:4] == b"\x89PNG"
    table = (tmp_path / "out" / "report" / "ruler_table.md").read_text()
    assert "MK-NIAH-2" in table and "FWE" in table and "| Task | 1K | 2K | Avg. |" in table
