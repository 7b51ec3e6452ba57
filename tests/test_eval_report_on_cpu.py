"""Results store (resume, torn lines), table arithmetic, the paper transcription, and viewer escaping.

The end-to-end path with real (tiny) models is tests/test_eval_e2e_on_cpu.py; here the inputs
are small hand-written rows so each number can be checked by hand.

    .venv/bin/pytest tests/test_eval_report_on_cpu.py -q
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from eval import paper_numbers
from eval.latency import read_floors, write_floors
from eval.report import build_report, max_delta_avg
from eval.store import RESULTS, ResultsStore, read_jsonl, read_timings
from eval.viewer import render_page
from parser.records.result import ResultRow, TimingLine
from parser.records.trace import SequentialTrace
from parser.records.trajectory import Trajectory


def _row(dataset="synthetic", length=50, run=0, sid="q0", row="ParSer", sub=1.0, steps=3, **kw) -> ResultRow:
    return ResultRow(**{"dataset": dataset, "length": length, "run": run, "sample_id": sid, "condition": None,
                        "condition_index": None, "method": row.lower(), "row": row, "backbone": "tiny", "question": "q?",
                        "answers": ["a"], "prediction": "a", "scores": {"sub_em": sub, "em": sub, "sub_em_compat": sub, "em_compat": sub},
                        "steps": steps, "wall_s": 1.0, "lead_output_tokens": 10, "subagent_output_tokens": 20, "meta": {},
                        **kw})


def test_store_skips_done_keys_and_survives_a_torn_line(tmp_path):
    store = ResultsStore(tmp_path)
    assert store.append(_row(sid="a"))
    assert not store.append(_row(sid="a"))  # same (dataset, length, condition, run, id): never twice
    assert store.append(_row(sid="a", run=1))
    with open(tmp_path / RESULTS, "a") as f:  # a kill mid-write leaves half a line
        f.write('{"dataset": "synthetic", "length": 50, "ru')
    reopened = ResultsStore(tmp_path)
    assert reopened.done_keys() == {("synthetic", 50, None, 0, "a"), ("synthetic", 50, None, 1, "a")}
    assert reopened.append(_row(sid="b"))
    assert [r["sample_id"] for r in read_jsonl(tmp_path / RESULTS)] == ["a", "a", "b"]  # file is clean again


def test_store_names_the_line_of_a_corrupt_row_and_still_opens(tmp_path):
    (tmp_path / RESULTS).write_text(json.dumps(_row().to_dict()) + "\nnot json\n" + json.dumps(_row(sid="b").to_dict()) + "\n")
    store = ResultsStore(tmp_path)
    assert len(store.rows()) == 2 and store.problems[0].startswith(f"{tmp_path / RESULTS}:2: not a JSON row")


@pytest.mark.parametrize("key", sorted(paper_numbers.MAX_DELTA_AVG))
def test_paper_transcription_reproduces_published_max_delta_and_avg(key):
    values = list(paper_numbers.SUB_EM[key[0]][key[1]][key[2]].values())
    delta, avg = max_delta_avg(values)
    published_delta, published_avg = paper_numbers.MAX_DELTA_AVG[key]
    assert avg == pytest.approx(published_avg, abs=0.011)  # cells and totals are each rounded to 0.01
    if published_delta is not None:
        assert delta == pytest.approx(published_delta, abs=0.011)  # cells and totals are each rounded to 0.01


def test_report_tables_latency_and_figures(tmp_path):
    parser_dir, mem_dir = tmp_path / "parser", tmp_path / "memagent"
    ps, ms = ResultsStore(parser_dir), ResultsStore(mem_dir)
    for run in (0, 1):
        for sid, sub in (("q0", 1.0), ("q1", float(run))):  # run 0: 50%, run 1: 100% -> 75%
            ps.append(_row(length=50, run=run, sid=sid, sub=sub, steps=2))
            ps.append(_row(length=100, run=run, sid=sid, sub=1.0, steps=2))
            ms.append(_row(length=50, run=run, sid=sid, row="MemAgent", sub=0.0, steps=3))
            ms.append(_row(length=100, run=run, sid=sid, row="MemAgent", sub=1.0, steps=5))
        for L, p_wall, m_wall in ((50, 2.0, 4.0), (100, 2.0, 8.0)):
            ps.log_timing(TimingLine(dataset="synthetic", length=L, run=run, condition=None, row="ParSer",
                                     backbone="tiny", concurrency=1, samples=2, wall_s=p_wall))
            ms.log_timing(TimingLine(dataset="synthetic", length=L, run=run, condition=None, row="MemAgent",
                                     backbone="tiny", concurrency=1, samples=2, wall_s=m_wall))
    write_floors(tmp_path, [{"dataset": "synthetic", "backbone": "tiny", "length": 100, "seconds": 0.5}])  # the latency bench's
    out = build_report([tmp_path], tmp_path / "report")

    lines = {label: (values, delta, avg) for _, label, values, delta, avg, _ in out["tables"]["synthetic"]["lines"]}
    assert lines["ParSer"][0] == {50: 75.0, 100: 100.0}
    assert lines["ParSer"][1:] == (25.0, 87.5)
    lat = {(e["row"], e["length"]): e for e in out["latency"]}
    assert lat[("ParSer", 50)]["amortized_s"] == pytest.approx(1.0)  # (2 + 2) s / 4 samples
    assert lat[("MemAgent", 100)]["steps"] == 5
    speed = {s["length"]: s["speedup"] for s in out["speedups"]}
    assert speed == {50: pytest.approx(2.0), 100: pytest.approx(4.0)}
    # the floor at L=100: ParSer 1 s/sample is 2x it, MemAgent 4 s/sample 8x (the speedup figure draws the 8x)
    assert {(e["row"], e["length"]): e["x_floor"] for e in out["over_floor"]} == {("ParSer", 100): 2.0, ("MemAgent", 100): 8.0}
    assert "| synthetic | tiny | MemAgent | 1 | 100 | 0.500 | 8.00x |" in (tmp_path / "report" / "latency.md").read_text()
    for name in ("accuracy.md", "accuracy.tex", "accuracy.csv", "latency.md", "latency.csv", "tokens.csv", "report.md"):
        assert (tmp_path / "report" / name).stat().st_size > 0
    assert "\\begin{tabular}" in (tmp_path / "report" / "accuracy.tex").read_text()
    assert "| ParSer | tiny" not in (tmp_path / "report" / "accuracy.md").read_text()  # backbone column comes first
    assert {p.name for p in out["figures"]} == {"accuracy_vs_length_synthetic.png", "speedup_vs_length.png", "steps_vs_length.png"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in out["figures"])
    assert len(out["viewer"]) == 2


def test_a_floor_line_without_its_keys_is_refused_naming_the_line(tmp_path):
    (tmp_path / "floor.jsonl").write_text('{"dataset": "synthetic", "backbone": "tiny", "length": 12, "seconds": 1.0}\n'
                                          '{"dataset": "synthetic", "length": 24}\n')
    with pytest.raises(ValueError, match=r"floor.jsonl:2: a floor line needs \['backbone', 'seconds'\]"):
        read_floors([tmp_path])


def test_report_puts_paper_rows_beside_ours(tmp_path):
    store = ResultsStore(tmp_path / "run")
    store.append(_row(dataset="hotpotqa", length=50, sub=1.0, backbone="Qwen3.5-4B"))
    out = build_report([tmp_path], tmp_path / "report", with_paper=True, viewer=False)
    lines = {label: values for _, label, values, *_ in out["tables"]["hotpotqa"]["lines"]}
    assert lines["ParSer (paper)"] == {50: 85.68}
    assert "85.68" in (tmp_path / "report" / "accuracy.csv").read_text()


def test_controlled_tables_give_each_methods_spread_and_one_figure_for_all_sets(tmp_path):
    """Order study rows: accuracy per condition, spread = max − min of those, sets in the paper's panel order."""
    cells = {  # (dataset, control, method folder, row) -> {condition: [sub_em per sample]}
        ("synthetic_distance", "distance", "coa", "CoA (document)"): {"d0": [1, 1], "d20": [1, 0]},
        ("synthetic_position", "position", "coa", "CoA (document)"): {"st00": [1, 1], "st50": [0, 0], "st90": [1, 0]},
        ("synthetic_position", "position", "parser", "ParSer"): {"st00": [1, 0], "st50": [1, 0], "st90": [1, 0]},
    }
    for (dataset, control, folder, row), conditions in cells.items():
        store = ResultsStore(tmp_path / dataset / folder)
        for index, (condition, subs) in enumerate(conditions.items()):
            for k, sub in enumerate(subs):
                store.append(_row(dataset=dataset, sid=f"q{k}_{condition}", row=row, sub=float(sub), condition=condition,
                                  condition_index=index, meta={"meta": {"control": control}}))
    out = build_report([tmp_path], tmp_path / "report", viewer=False)
    assert list(out["controlled"]) == ["synthetic_position", "synthetic_distance"]  # position, order, distance
    position = out["controlled"]["synthetic_position"]
    assert position["lines"][("tiny", "CoA (document)")] == {"st00": 100.0, "st50": 0.0, "st90": 50.0}
    assert position["spread"] == {("tiny", "CoA (document)"): 100.0, ("tiny", "ParSer"): 0.0}
    assert out["controlled"]["synthetic_distance"]["spread"] == {("tiny", "CoA (document)"): 50.0}
    sensitivity = (tmp_path / "report" / "sensitivity.md").read_text()
    assert "| tiny | CoA (document) | 100.00 | 50.00 |" in sensitivity and "| tiny | ParSer | 0.00 | – |" in sensitivity
    assert "| Backbone | Method | st00 | st50 | st90 | Spread (max − min) |" in (tmp_path / "report" / "controlled.md").read_text()
    assert {p.name for p in out["figures"]} >= {"controlled_synthetic_position.png", "controlled_sensitivity.png"}


def test_evidence_reading_says_when_each_order_read_the_gold_chunks():
    from eval.report import evidence_reading

    # five chunks; gold paragraphs 3 and 9 sit in chunks 1 and 4; the reasoning needs 3 before 9
    paragraphs = [[1, 2], [3, 4], [5, 6], [7, 8], [9]]
    meta = {"gold_paragraph_ids": [3, 9], "evidence_order": [3, 9]}
    rows = [_row(row="CoA (document)", condition="d0", meta=meta,
                 trace=SequentialTrace(5, reading_order=[0, 1, 2, 3, 4], chunk_paragraphs=paragraphs)),
            _row(row="CoA (CL-order)", condition="d0", meta=meta,
                 trace=SequentialTrace(5, reading_order=[4, 1, 0, 2, 3], chunk_paragraphs=paragraphs)),
            _row(row="ParSer", condition="d0", meta=meta, trace=Trajectory("q?", "q0", 5))]
    got = {e["row"]: (e["first"], e["last"], e["gap"], e["in_order"], e["chunks"]) for e in evidence_reading(rows)}
    assert got == {"CoA (document)": (0.25, 1.0, 3, 1.0, 5), "CoA (CL-order)": (0.0, 0.25, 1, 0.0, 5)}  # ParSer: no order


def test_viewer_escapes_model_text():
    evil = '<script>alert("x")</script>'
    record = {"turns": [{"index": 0, "text": evil, "thinking": evil, "answer": None, "action_error": None,
                         "lead_tokens": 5, "finish_reason": "stop", "lead_latency_s": 0.1,
                         "queries": [{"query": evil, "omitted": 0, "observation": evil,
                                      "findings": [{"agent": "agent_3", "chunk_index": 3, "answer": evil, "evidence": evil,
                                                    "merged_agents": ["agent_7"]}],
                                      "calls": [{"status": "failed", "chunk_index": 1, "attempts": 4, "error": evil},
                                                {"status": "abstain_count", "count": 6}]}]}],
              "question": evil, "doc_id": "q0", "stop_reason": "max_turns", "num_chunks": 8}
    page = render_page([_row(prediction=evil, trace=Trajectory.from_dict(record), question=evil)], "t")
    assert "<script>" not in page
    assert "&lt;script&gt;" in page
    assert "agent_3, agent_7" in page and "6 abstained" in page and "1 failed" in page


def test_latency_counts_the_samples_of_a_killed_session_once(tmp_path):
    """Session A finished 3 samples of a subset and was killed (no timing line); session B ran
    the other 2 and logged 4 s. The table must time all 5, each once."""
    store = ResultsStore(tmp_path / "run")
    base = {"length": 50, "backbone": "tiny", "concurrency": 1}
    for i, (finished_at, wall) in enumerate(((101.0, 1.0), (103.0, 2.0), (106.0, 3.0))):
        store.append(_row(sid=f"q{i}", session="A", finished_at=finished_at, wall_s=wall, **base))
    for i in (3, 4):
        store.append(_row(sid=f"q{i}", session="B", finished_at=300.0 + i, wall_s=2.0, **base))
    store.log_timing(TimingLine(dataset="synthetic", length=50, run=0, condition=None, row="ParSer", backbone="tiny",
                                concurrency=1, samples=2, wall_s=4.0, session="B"))
    from eval.report import latency_table

    (entry,) = latency_table(store.rows(), read_timings(tmp_path / "run"))
    assert entry["samples"] == 5
    assert entry["amortized_s"] == pytest.approx((6.0 + 4.0) / 5)  # A: 100 s (first start) .. 106 s


def test_a_second_process_cannot_take_a_run_dir(tmp_path):
    from eval.store import RunDirLocked, lock_run_dir

    with lock_run_dir(tmp_path / "run"):
        with pytest.raises(RunDirLocked, match=r"in use by another eval.run \(pid \d+"):
            with lock_run_dir(tmp_path / "run"):
                pass
    with lock_run_dir(tmp_path / "run"):  # released on exit
        pass


# ----------------------------------------------------------------------------- never silently mixed

def _run_dir(path, rows, max_turns=4, runs=(0,)):
    from eval import provenance

    store = ResultsStore(path)
    for r in rows:
        store.append(r)
    provenance.write_manifest(path, {"method": {"name": "parser", "label": "ParSer", "episode": {"max_turns": max_turns}},
                                     "models": {"lead": {"model": "tiny"}}}, {"base": 0, "per_run": list(runs)})
    return path


def test_runs_with_other_settings_are_separate_rows_labelled_with_the_difference(tmp_path):
    """Two runs of one method with max_turns 2 and 4 used to become one row (and one sample id
    counted twice); now each is its own row, named by the key that differs."""
    _run_dir(tmp_path / "a", [_row(sid="q0", sub=1.0), _row(sid="q1", sub=1.0)], max_turns=2)
    _run_dir(tmp_path / "b", [_row(sid="q0", sub=0.0), _row(sid="q1", sub=0.0)], max_turns=4)
    out = build_report([tmp_path], tmp_path / "report", viewer=False)
    lines = {label: values for _, label, values, *_ in out["tables"]["synthetic"]["lines"]}
    assert lines == {"ParSer [method.episode.max_turns=2]": {50: 100.0}, "ParSer [method.episode.max_turns=4]": {50: 0.0}}


def test_the_same_sample_in_two_run_directories_is_refused(tmp_path):
    _run_dir(tmp_path / "a", [_row(sid="q0")])
    _run_dir(tmp_path / "b", [_row(sid="q0"), _row(sid="q1")])
    with pytest.raises(ValueError, match=r"sample 'q0' .* is in both .*a and .*b: a table would count it twice"):
        build_report([tmp_path], tmp_path / "report", viewer=False)


def test_partial_rows_spread_and_ties_are_shown_as_they_are(tmp_path):
    """A row with 2 of 4 samples is marked (2/4); each value carries its spread over runs; a tie
    (0.00 in every row) is not bolded as best."""
    full = [_row(sid=f"q{i}", run=run, sub=float(run), row="ParSer") for run in (0, 1) for i in range(4)]
    half = [_row(sid=f"q{i}", run=run, sub=0.0, row="MemAgent", length=50) for run in (0, 1) for i in range(2)]
    _run_dir(tmp_path / "p", full, runs=(0, 1))
    _run_dir(tmp_path / "m", half, runs=(0, 1))
    build_report([tmp_path], tmp_path / "report", viewer=False)
    md = (tmp_path / "report" / "accuracy.md").read_text()
    parser_line = next(line for line in md.splitlines() if line.startswith("| tiny | ParSer"))
    memagent_line = next(line for line in md.splitlines() if line.startswith("| tiny | MemAgent"))
    assert "50.00 ± 70.71" in parser_line and "(" not in parser_line.split("|")[3]  # runs 0% and 100%
    assert "0.00 ± 0.00 (2/4)" in memagent_line and "**" not in memagent_line
    _run_dir(tmp_path / "t1", [_row(sid="q0", sub=0.0, row="A", dataset="tie")])
    _run_dir(tmp_path / "t2", [_row(sid="q0", sub=0.0, row="B", dataset="tie")])
    build_report([tmp_path / "t1", tmp_path / "t2"], tmp_path / "tie", viewer=False)
    assert "**" not in (tmp_path / "tie" / "accuracy.md").read_text()


def test_identical_accuracy_lines_stay_visible_in_the_figure(tmp_path, monkeypatch):
    """Two methods with the same values used to draw one line exactly over the other: each line
    now has its own marker, dash and size."""
    import matplotlib.axes

    drawn = []
    original = matplotlib.axes.Axes.plot

    def recording(self, *args, **kwargs):
        drawn.append((kwargs.get("marker"), str(kwargs.get("linestyle")), kwargs.get("markersize")))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording)
    _run_dir(tmp_path / "a", [_row(sid="q0", sub=1.0, row="A")])
    _run_dir(tmp_path / "b", [_row(sid="q0", sub=1.0, row="B")])
    build_report([tmp_path], tmp_path / "report", viewer=False)
    first, second = drawn[:2]
    assert first[0] != second[0] and first[1] != second[1] and first[2] != second[2]


# ----------------------------------------------------------------------------- never an impossible number (issue 55 item 7)

@pytest.mark.parametrize("scores", [{"sub_em": 1.7}, {"sub_em": -0.5}, {"em": 2.0}, {"sub_em_compat": 100.0}])
def test_a_rate_outside_0_1_is_refused_naming_its_row(tmp_path, scores):
    _run_dir(tmp_path / "a", [_row(sid="q0"), dataclasses.replace(_row(sid="q7"), scores={**_row().scores, **scores})])
    name, value = next(iter(scores.items()))
    with pytest.raises(ValueError, match=rf"results.jsonl: row 'q7' \(synthetic, L=50, run 0, row 'ParSer'\): {name} = "
                                         rf"{value!r} is outside \[0, 1\]"):
        build_report([tmp_path], tmp_path / "report", viewer=False)


@pytest.mark.parametrize("field", ["steps", "wall_s", "lead_output_tokens"])
def test_a_negative_count_or_time_is_refused_naming_its_row(tmp_path, field):
    _run_dir(tmp_path / "a", [_row(sid="q0"), _row(sid="q3", **{field: -4})])
    with pytest.raises(ValueError, match=rf"row 'q3' .*: {field} = -4(\.0)? is negative"):
        build_report([tmp_path], tmp_path / "report", viewer=False)


def test_a_null_metric_is_scored_from_the_prediction(tmp_path, capsys):
    _run_dir(tmp_path / "a", [_row(sid="q0", prediction="Paris", answers=["Paris"]), _row(sid="q1", prediction="Rome", answers=["Paris"])])
    lines = (tmp_path / "a" / RESULTS).read_text().splitlines()
    nulled = [json.dumps({**json.loads(line), "sub_em": None, "em": None}) for line in lines]
    (tmp_path / "a" / RESULTS).write_text("\n".join(nulled) + "\n")
    out = build_report([tmp_path], tmp_path / "report", viewer=False)
    assert out["tables"]["synthetic"]["lines"][0][2] == {50: 50.0}  # "Paris" is right, "Rome" is wrong
    assert "2 rows had no sub_em (null)" in capsys.readouterr().out


def test_a_partial_run_is_marked_n_of_N_in_every_table(tmp_path):
    from eval import provenance

    rows = [_row(sid=f"q{i}") for i in range(3)]
    _run_dir(tmp_path / "a", rows)
    provenance.close_session(tmp_path / "a", written=3, failed=0, expected=8, done=3)
    store = ResultsStore(tmp_path / "a")
    store.log_timing(TimingLine(dataset="synthetic", length=50, run=0, condition=None, method="parser", row="ParSer",
                                backbone="tiny", concurrency=1, samples=3, failed=0, wall_s=3.0, pid=1, session="s", finished="t"))
    build_report([tmp_path], tmp_path / "report", viewer=False)
    for name in ("accuracy.md", "accuracy.csv", "accuracy.tex", "latency.md", "latency.csv", "tokens.md", "tokens.csv", "report.md"):
        assert "ParSer (partial: 3 of 8 samples)" in (tmp_path / "report" / name).read_text(), name


@pytest.mark.parametrize("case, said", [
    ("missing", "no such directory"), ("empty", "no results.jsonl here or below"),
    ("duplicate", "a table would count it twice"), ("out_is_a_file", "exists and is not a directory"),
    ("out_under_a_file", "cannot create it"), ("bad_rate", "is outside [0, 1]"), ("bad_timing", "neither can be negative")])
def test_the_command_ends_in_one_line_with_exit_2(tmp_path, capsys, case, said):
    from eval import provenance
    from eval.report import main

    runs, out = tmp_path / "runs", tmp_path / "report"
    _run_dir(runs / "a", [_row(sid="q0")])
    args = [str(runs)]
    if case == "missing":
        args = [str(tmp_path / "nope")]
    elif case == "empty":
        (tmp_path / "empty").mkdir()
        args = [str(tmp_path / "empty")]
    elif case == "duplicate":  # a partial copy of the run: its label is marked, the sample is still the same
        _run_dir(runs / "copy", [_row(sid="q0")])
        provenance.close_session(runs / "copy", expected=2)
    elif case in ("out_is_a_file", "out_under_a_file"):
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / ("sub" if case == "out_under_a_file" else "")
    elif case == "bad_rate":
        _run_dir(runs / "b", [dataclasses.replace(_row(sid="q1"), scores={**_row().scores, "sub_em": 3.0})])
    elif case == "bad_timing":
        ResultsStore(runs / "a").log_timing(TimingLine(dataset="synthetic", length=50, run=0, samples=1, wall_s=-3.0))
    with pytest.raises(SystemExit) as ended:
        main([*args, "--out", str(out).rstrip("/"), "--no-viewer"])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and said in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_the_cost_table_sets_steps_sub_calls_and_seconds_beside_accuracy_for_each_peer(tmp_path):
    """Issue 54: the two RLM rows and InfMem-4B stay apart (row and backbone), and each shows what it
    cost, read from its trace: RLM's sub-model calls, ParSer's subagent requests, InfMem's planner calls
    and early stop; MemAgent has neither count ("–", not 0)."""
    from parser.records.trajectory import QueryRecord, SubagentCall, Turn

    def rlm(sub_calls):
        usage = {"root": {"calls": 3, "input_tokens": 9, "output_tokens": 9}, "sub": {"calls": sub_calls, "input_tokens": 1, "output_tokens": 1}}
        return Trajectory("q?", "d", 0, extras={"rlm": {"usage": usage, "iterations": []}})

    def infmem(plans, stopped):
        return SequentialTrace(4, [0, 1, 2, 3][:plans], extras={"plans": [{"chunk": i} for i in range(plans)], "stopped_early": stopped})

    scatter = QueryRecord("who?", [], [SubagentCall(i, "abstain") for i in range(5)], "")
    parser = Trajectory("q?", "d", 5, turns=[Turn(0, "", "", [scatter], None, None, 1, "stop", 0.1)])
    for sid, trace, row, backbone, sub, wall in (
            ("a", rlm(6), "RLM (same models as ParSer)", "tiny", 1.0, 2.0), ("b", rlm(2), "RLM (same models as ParSer)", "tiny", 0.0, 4.0),
            ("a", rlm(10), "RLM (authors' setup)", "strong root", 1.0, 9.0), ("a", infmem(3, True), "InfMem", "InfMem-4B", 1.0, 5.0),
            ("b", infmem(4, False), "InfMem", "InfMem-4B", 1.0, 7.0), ("a", parser, "ParSer", "tiny", 1.0, 1.0),
            ("a", SequentialTrace(4, [0, 1, 2, 3]), "MemAgent", "tiny", 0.0, 3.0)):
        ResultsStore(tmp_path / f"{backbone}-{row}").append(_row(sid=sid, row=row, backbone=backbone, sub=sub, steps=3,
                                                                 trace=trace, wall_s=wall))
    out = build_report([tmp_path], tmp_path / "report", viewer=False)
    costs = {(c["backbone"], c["row"]): c for c in out["costs"]}
    assert len(costs) == 5  # every row apart
    same = costs[("tiny", "RLM (same models as ParSer)")]
    assert (same["accuracy"], same["sub_calls"], same["wall_s"], same["plans"]) == (50.0, 4.0, 3.0, None)
    assert costs[("strong root", "RLM (authors' setup)")]["sub_calls"] == 10.0
    infmem_row = costs[("InfMem-4B", "InfMem")]
    assert (infmem_row["plans"], infmem_row["stopped_early"], infmem_row["sub_calls"]) == (3.5, 0.5, None)
    assert costs[("tiny", "ParSer")]["sub_calls"] == 5.0
    table = (tmp_path / "report" / "cost.md").read_text()
    assert "| tiny | MemAgent | 50 | 0.00 | 3.00 | – | – | – | 3.000 | 1 |" in table
    assert "| InfMem-4B | InfMem | 50 | 100.00 | 3.00 | – | 3.5 | 0.50 | 6.000 | 2 |" in table
    assert table in (tmp_path / "report" / "report.md").read_text()
