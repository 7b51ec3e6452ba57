"""One result row type (`parser.records.result.ResultRow`): eval.run writes it, the report reads it by
attribute, and files written before the type existed load unchanged.

    .venv/bin/pytest tests/test_result_rows_on_cpu.py -q
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from parser.records.metrics import METRICS
from eval.report import build_report
from eval.store import RESULTS, ResultsStore, read_results
from parser.records.sample import DataError
from parser.records.result import ResultRow, TimingLine
from parser.records.trace import CallTrace, SequentialTrace
from parser.records.trajectory import Trajectory

# A row exactly as eval.run wrote it before ResultRow (keys and their order), with a saved record.
OLD_ROW = {
    "dataset": "synthetic", "length": 50, "run": 1, "sample_id": "q3_L50", "condition": None, "condition_index": None,
    "method": "parser", "row": "ParSer", "variant": None, "backbone": "tiny-qwen3", "question": "Who?",
    "answers": ["Ann", "Anne"], "prediction": "Ann", "sub_em": 1.0, "em": 1.0, "sub_em_compat": 1.0, "em_compat": 1.0,
    "sub_em_release": 1.0, "steps": 3, "wall_s": 0.1234, "lead_output_tokens": 40, "subagent_output_tokens": 120,
    "meta": {"index": 3, "meta": {"control": "position"}}, "finished": "2026-11-02T10:00:00+00:00",
    "finished_at": 1793000000.5, "session": "123@1793000000.000", "concurrency": 4,
    "record": {"num_chunks": 2, "order": "document", "reading_order": [0, 1], "order_s": 0.0, "chunk_paragraphs": [[0], [1]],
               "final_memory": "Ann", "final_reply": "\\boxed{Ann}", "extracted_by": "boxed", "empty_final_reply": False,
               "updates": [{"chunk": 0, "tokens": 3}, {"chunk": 1, "tokens": 4}]},
}


def test_a_row_written_before_the_type_reads_and_writes_back_byte_for_byte():
    row = ResultRow.from_dict(OLD_ROW, "run/results.jsonl:1")
    assert row.key == ("synthetic", 50, None, 1, "q3_L50") and row.score("sub_em") == 1.0 and row.meta["index"] == 3
    assert isinstance(row.trace, SequentialTrace) and row.trace.reading_order == [0, 1]
    assert row.trace.extras == {"final_memory": "Ann"}  # the method's own part
    written = row.to_dict()
    assert written["record"].pop("kind") == "sequential"  # the one key a trace gains on disk
    assert json.dumps(written) == json.dumps(OLD_ROW)  # same keys, same order, same values
    without_record = {k: v for k, v in OLD_ROW.items() if k != "record"}
    assert json.dumps(ResultRow.from_dict(without_record).to_dict()) == json.dumps(without_record)


def test_older_rows_missing_later_fields_still_load(tmp_path):
    """Rows from before sessions, concurrency, the release metric and variants."""
    oldest = {k: OLD_ROW[k] for k in ("dataset", "length", "run", "sample_id", "condition", "method", "row", "backbone",
                                       "question", "answers", "prediction", "sub_em", "em", "steps", "wall_s",
                                       "lead_output_tokens", "subagent_output_tokens", "meta", "finished")}
    (tmp_path / RESULTS).write_text(json.dumps(oldest) + "\n" + json.dumps({**oldest, "length": "100"}) + "\n")
    rows = read_results(tmp_path)
    assert [r.length for r in rows] == [50, 100]
    assert rows[0].session == "" and rows[0].finished_at is None and "sub_em_release" not in rows[0].scores
    assert rows[0].variant is None and rows[0].trace is None
    assert rows[0].to_dict()["sub_em_release"] is None  # written back as the key it was read as missing


@pytest.mark.parametrize(("edit", "field"), [
    ({"length": "fifty"}, "length"), ({"run": 1.5}, "run"), ({"run": [1]}, "run"), ({"sub_em": "yes"}, "sub_em"),
    ({"meta": []}, "meta"), ({"answers": "Ann"}, "answers"), ({"record": "trace"}, "record"),
    ({"record": {"reading_order": [0]}}, "record"), ({"record": {"kind": "tree"}}, "record"),
    ({"concurrency": True}, "concurrency"), ({"dataset": None}, "dataset"), ({"sample_id": ""}, "sample_id"),
])
def test_a_row_of_the_wrong_shape_is_skipped_and_named_by_file_line_and_field(tmp_path, edit, field):
    good = json.dumps(OLD_ROW)
    (tmp_path / RESULTS).write_text(good + "\n" + json.dumps({**OLD_ROW, "sample_id": "x", **edit}) + "\n")
    store = ResultsStore(tmp_path)
    assert [r.sample_id for r in store.rows()] == ["q3_L50"]
    (problem,) = store.problems
    assert problem.startswith(f"{tmp_path / RESULTS}:2: ") and f"field {field!r}" in problem and "skipped" in problem
    with pytest.raises(DataError, match=f"here: .*field {field!r}"):
        ResultRow.from_dict({**OLD_ROW, **edit}, "here")


def test_every_metric_eval_reports_is_a_key_of_the_row_on_disk_and_nothing_else_is_a_score():
    written = ResultRow.from_dict(OLD_ROW).to_dict()
    assert [m.name for m in METRICS] == [k for k in written if k in ResultRow.from_dict(OLD_ROW).scores]
    assert not {m.name for m in METRICS} & {f.name for f in dataclasses.fields(ResultRow)}  # names live in METRICS only


def test_the_store_refuses_a_plain_dict_where_a_row_belongs(tmp_path):
    store = ResultsStore(tmp_path)
    with pytest.raises(TypeError, match="ResultRow"):
        store.append(dict(OLD_ROW))
    with pytest.raises(TypeError, match="TimingLine"):
        store.log_timing({"dataset": "d", "length": 50})


def test_a_timing_line_round_trips():
    line = TimingLine(dataset="d", length=50, run=0, condition=None, method="parser", row="ParSer", backbone="b",
                      concurrency=2, samples=3, failed=1, wall_s=1.5, pid=7, session="7@1.0", finished="t")
    assert TimingLine.from_dict(json.loads(json.dumps(line.to_dict()))) == line


# Run directories written by `eval.run` (tiny CPU models, seven methods: every trace shape) before
# traces were typed, and the report the code of that time built from them (text files and viewer pages;
# `{out}` stands for the report's own folder, which report.md names).
OLD_RUNS = "tests/fixtures/runs_before_typed_traces"
OLD_REPORT = Path(__file__).parent / "fixtures" / "report_before_typed_traces"


def test_run_dirs_written_before_typed_traces_load_and_report_identically(tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[1])  # the report names run directories as given
    for run_dir in sorted(Path(OLD_RUNS).iterdir()):
        lines = [json.loads(line) for line in (run_dir / RESULTS).read_text().splitlines()]
        rows = read_results(run_dir)
        kinds = {type(r.trace) for r in rows}
        assert len(kinds) == 1 and kinds <= {Trajectory, SequentialTrace, CallTrace}, run_dir
        # written back unchanged but for the trace's `kind`
        assert [json.dumps(r.to_dict()) for r in rows] == [
            json.dumps({**line, "record": {**line["record"], "kind": r.trace.kind}}) for line, r in zip(lines, rows, strict=True)], run_dir
    build_report([OLD_RUNS], tmp_path)
    expected = sorted(p.relative_to(OLD_REPORT) for p in OLD_REPORT.rglob("*") if p.is_file())
    assert expected
    for name in expected:
        assert (tmp_path / name).read_text() == (OLD_REPORT / name).read_text().replace("{out}", str(tmp_path)), name


def test_the_report_reads_rows_and_traces_by_attribute_never_by_key():
    """eval/report.py read a row's `meta` and a trace's `extras` and `stats()` by string key, so a
    renamed field read None (or raised) far from its cause; the record types now say what they hold."""
    import ast

    tree = ast.parse((Path(__file__).parents[1] / "eval" / "report.py").read_text())
    by_key = sorted({node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in ("meta", "extras", "stats")})
    assert by_key == []
    row = ResultRow.from_dict({**OLD_ROW, "meta": {"gold_paragraph_ids": [3, 9], "evidence_order": [9, 3], "meta": {"control": "order"}}})
    assert (row.gold_paragraph_ids, row.evidence_order, row.control) == ([3, 9], [9, 3], "order")
    assert (ResultRow.from_dict({**OLD_ROW, "meta": {}}).control, ResultRow.from_dict(OLD_ROW).gold_paragraph_ids) == (None, None)
    usage = {"root": {"calls": 3}, "sub": {"calls": 7}}
    assert Trajectory("q?", "d", 0, extras={"rlm": {"usage": usage}}).sub_calls == 7 and Trajectory("q?", "d", 2).sub_calls == 0
    planned = SequentialTrace(4, [0, 1], extras={"plans": [{}, {}], "stopped_early": True})
    assert (planned.planner_calls, planned.stopped_early) == (2, True)
    assert (SequentialTrace(4, [0, 1]).planner_calls, SequentialTrace(4, [0, 1]).stopped_early) == (None, None)
