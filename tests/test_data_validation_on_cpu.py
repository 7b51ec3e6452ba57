"""Malformed source data fails clearly: errors name file, record and field; the CLI exits non-zero.

    .venv/bin/pytest tests/test_data_validation_on_cpu.py -q

Covers what used to slip through or crash bare: wrong types (TypeError/AttributeError), gold
answers that normalize to "" (free accuracy under Sub_EM), list-valued answers, duplicate ids,
empty and all-filtered inputs (exit 0 with empty files), and temp files left by killed builds.
"""
import os
import subprocess
import sys

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parser.records.jsonl import write_json
from data_prep.records import DataError
from data_prep.sources import check_eval_rows, read_2wiki, read_hotpotqa


def hotpot_row(**fields):
    row = {"id": "h1", "question": "Which city?", "answer": "Lyon", "type": "bridge", "level": "easy",
           "context": [["Alpha", ["Alpha is in Lyon. ", "It is old."]], ["Beta", ["Beta is a river."]]],
           "supporting_facts": [["Alpha", 0], ["Beta", 0]]}
    return {**row, **fields}


def wiki_row(**fields):
    row = {"id": "w1", "question": "Who directed it", "golden_answers": ["Anna Berg"],
           "metadata": {"type": "compositional", "evidences": [["Film", "director", "Anna"]],
                        "context": {"title": ["Film", "Anna"], "content": [["Film is by Anna."], ["Anna is Swedish."]]},
                        "supporting_facts": {"title": ["Film", "Anna"], "sent_id": [0, 0]}}}
    return {**row, **fields}


@pytest.mark.parametrize("read, rows, message", [
    (read_hotpotqa, [hotpot_row(answer="  A . ")], r"record 0: answer\[0\] = '  A . ' normalizes to nothing"),
    (read_hotpotqa, [hotpot_row(answer=["Lyon", "Paris"])], r"record 0: answer\[0\] must be a string, got list"),
    (read_hotpotqa, [hotpot_row(question={"text": "q"})], "record 0: field 'question' must be a string, got dict"),
    (read_hotpotqa, [hotpot_row(), hotpot_row(id="h2"), hotpot_row(id="h1")], "duplicate id 'h1' in records 0 and 2"),
    (read_hotpotqa, [hotpot_row(), 7], "record 1: expected a JSON object, got int"),
    (read_hotpotqa, [hotpot_row(context=[["Alpha", 3.5]])], r"context paragraph 0 \('Alpha'\) must be a string or a list"),
    (read_hotpotqa, [hotpot_row(supporting_facts=[None])], r"'supporting_facts\[0\]' is not a \[title, sentence_id\] pair"),
    (read_2wiki, [wiki_row(golden_answers=["Anna Berg", "an"])], r"golden_answers\[1\] = 'an' normalizes to nothing"),
    (read_2wiki, [wiki_row(golden_answers=[["Anna"]])], r"golden_answers\[0\] must be a string"),
    (read_2wiki, [wiki_row(metadata={**wiki_row()["metadata"], "evidences": [1, 2]})], "'metadata.evidences' must be a list"),
    (read_2wiki, [wiki_row(metadata="flat")], "field 'metadata': expected a JSON object, got str"),
])
def test_malformed_records_name_file_record_and_field(read, rows, message):
    with pytest.raises(DataError, match=message) as error:
        read(rows, source="src.jsonl")
    assert str(error.value).startswith("src.jsonl")


@pytest.mark.parametrize("rows, message", [
    ([{"context": "Document 1:\nx", "input": "q?", "answers": ["the"]}], r"record 0: answers\[0\] = 'the' normalizes to nothing"),
    ([{"context": "Document 1:\nx", "input": ["q?"], "answers": ["a1"]}], "record 0: field 'input' must be a string"),
    ([{"context": "Document 1:\nx", "input": "q?", "answers": "a1"}], "record 0: field 'answers' must be a list"),
    ([{"context": "c", "input": "q", "answers": ["x"], "id": "a"}, {"context": "c", "input": "q", "answers": ["y"], "id": "a"}],
     "duplicate id 'a'"),
    (["not a row"], "record 0: expected a JSON object"),
])
def test_malformed_eval_rows_name_the_field(rows, message):
    with pytest.raises(DataError, match=message):
        check_eval_rows(rows, "eval_50.json")


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                           max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(["id", "question", "answer", "context", "supporting_facts", "golden_answers", "metadata"]),
       value=json_values, wiki=st.booleans())
def test_any_field_value_is_accepted_or_a_data_error(field, value, wiki):
    """Fuzz: whatever JSON lands in a field, the reader raises DataError or reads it, never crashes."""
    row = wiki_row() if wiki else hotpot_row()
    if field == "context" and wiki:
        row["metadata"] = {**row["metadata"], "context": value}
    else:
        row[field] = value
    try:
        questions, _ = (read_2wiki if wiki else read_hotpotqa)([row], source="fuzz.jsonl")
    except DataError as error:
        assert str(error).startswith("fuzz.jsonl record 0")
    else:
        assert all(a.strip() for q in questions for a in q.answers)


def build(tmp_path, *overrides):
    return subprocess.run([sys.executable, "-m", "data_prep.build", "--config-name", "hotpotqa_eval",
                           f"out_dir={tmp_path / 'out'}", "lengths=[4]", "num_questions=1", *overrides],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=os.environ)


@pytest.mark.slow  # two fresh Hydra processes, ~5 s each
def test_build_cli_exits_non_zero_naming_the_problem(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(orjson.dumps(hotpot_row()) + b"\n" + orjson.dumps(hotpot_row(id="h2", answer="")) + b"\n")
    result = build(tmp_path, f"source.path={bad}")
    assert result.returncode == 2, result.stderr
    assert f"{bad} record 1: answer[0] = '' normalizes to nothing" in result.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = build(tmp_path, f"source.path={empty}")
    assert result.returncode == 2 and "no usable questions" in result.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_temp_files_of_killed_writers_are_removed_and_live_ones_kept(tmp_path):
    """A SIGKILLed build cannot clean up; the next write beside the same target does."""
    target = tmp_path / "eval_50.json"
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.kill()
    killed.wait()
    dead = tmp_path / f".eval_50.json.{killed.pid}.x1y2.tmp"
    old_style = tmp_path / ".eval_50.json.k3j2h1.tmp"
    live = tmp_path / f".eval_50.json.{os.getpid()}.abcd.tmp"
    other_target = tmp_path / f".eval_100.json.{killed.pid}.zz.tmp"
    for path in (dead, old_style, live, other_target):
        path.write_bytes(b"x" * 1000)
    write_json(target, [{"id": 1}])
    assert orjson.loads(target.read_bytes()) == [{"id": 1}]
    assert not dead.exists() and not old_style.exists()
    assert live.exists() and other_target.exists()
