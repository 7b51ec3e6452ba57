"""Table 7 in miniature from two eval runs and a training log: the layout, the curve, summary.json.

    .venv/bin/pytest tests/test_eval_learning_on_cpu.py -q

Hand-written rows (eval.run's shape) so every number can be checked by hand; the real path is
the learning run's smoke (tests/e2e/test_verl_trainer_on_cpu.py).
"""
from __future__ import annotations

import json

import pytest

from eval import learning
from eval.report import build_report, main
from eval.store import ResultsStore
from parser.records.result import ResultRow


def _row(variant, length, run, sid, sub, steps) -> ResultRow:
    return ResultRow(dataset="synthetic_heldout", length=length, run=run, sample_id=f"{sid}_L{length}",
                     condition=None, condition_index=None, method="parser", row=f"ParSer {variant}",
                     variant=variant, backbone="tiny", question=sid + "?", answers=["a"], prediction="a",
                     scores={"sub_em": sub, "em": sub, "sub_em_compat": sub, "em_compat": sub}, steps=steps, wall_s=1.0,
                     lead_output_tokens=10, subagent_output_tokens=20, meta={})


@pytest.fixture()
def runs(tmp_path):
    before, after = ResultsStore(tmp_path / "before"), ResultsStore(tmp_path / "after")
    for run in (0, 1):
        for length in (20, 50):
            for i in range(4):  # before: 1 of 4 right at L=20, 2 of 4 at L=50; after: 3 of 4 everywhere
                before.append(_row(learning.WITHOUT, length, run, f"q{i}", float(i < (1 if length == 20 else 2)), 2))
                after.append(_row(learning.WITH, length, run, f"q{i}", float(i < 3), 3))
    log = tmp_path / "train.jsonl"
    log.write_text("".join(json.dumps({"step": s, "data": {"parser/reward/mean": 0.1 * s, "parser/turns/mean": 2.0,
                                                             "parser/queries_per_turn": 0.5,
                                                             "parser/invalid_action_rate": 0.0}}) + "\n"
                           for s in range(1, 11)))
    return tmp_path, log


def test_table7_layout_puts_both_variants_under_one_method(runs):
    tmp, log = runs
    result = build_report([tmp / "before", tmp / "after"], tmp / "report", viewer=False, train_log=log)
    rl = (tmp / "report" / "rl.md").read_text()
    assert "| Backbone | Method |  | 20 | 50 | Avg. |" in rl
    assert "| tiny | ParSer | w/o RL | 25.00 | 50.00 | 37.50 |" in rl
    assert "|  |  | w/ RL | 75.00 | 75.00 | 75.00 |" in rl  # backbone and method shown once, as in the paper
    assert (tmp / "report" / "figures" / "training_curve.png").stat().st_size > 1000
    assert result["rl"]["synthetic_heldout"]["lines"][0][2] == learning.WITHOUT


def test_summary_has_exactly_the_issue_keys_and_judges_learning(runs, capsys):
    tmp, log = runs
    summary = tmp / "summary.json"
    main([str(tmp / "before"), str(tmp / "after"), "--out", str(tmp / "report"), "--no-viewer",
          "--train-log", str(log), "--summary", str(summary), "--require-learning"])
    figures = json.loads(summary.read_text())
    assert figures == {"steps": 10, "reward_first5": 0.3, "reward_last5": 0.8, "heldout_sub_em_before": 37.5,
                       "heldout_sub_em_after": 75.0, "heldout_questions": 4, "turns_before": 2.0, "turns_after": 3.0}
    assert "learning: yes" in capsys.readouterr().out
    assert learning.learning_failures({**figures, "heldout_sub_em_after": 40.0})  # +2.5 points is not learning
    with pytest.raises(SystemExit):  # the same run judged on a flat reward
        log.write_text("".join(json.dumps({"step": s, "data": {"parser/reward/mean": 0.5}}) + "\n" for s in range(1, 11)))
        main([str(tmp / "before"), str(tmp / "after"), "--out", str(tmp / "report"), "--no-viewer",
              "--train-log", str(log), "--require-learning"])


def test_a_bad_training_log_names_its_line(tmp_path):
    log = tmp_path / "train.jsonl"
    log.write_text(json.dumps({"step": 1, "data": {}}) + "\nnot json\n")
    with pytest.raises(ValueError, match=r"train.jsonl:2"):
        learning.read_train_log(log)


def test_a_training_log_line_is_cut_at_newline_only(tmp_path):
    """U+2028 / U+2029 / U+0085 unescaped inside a JSON string are characters, not line ends."""
    log = tmp_path / "train.jsonl"
    rows = [{"step": s, "data": {f"note{sep}": 0.5}} for s, sep in enumerate(("\u2028", "\u2029", "\x85"), start=1)]
    log.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    assert learning.read_train_log(log) == {row["step"]: row["data"] for row in rows}
