"""One dataset record type (`parser.records.sample.Record`): data prep writes through it, eval reads
through it, and the rows on disk are what they were.

    .venv/bin/pytest tests/test_data_records_on_cpu.py -q
"""
from __future__ import annotations

import pytest

from data_prep import build_synthetic_eval
from data_prep.verl_parquet import rl_row
from parser.records.sample import DataError, Record
from parser.methods import Sample

# An eval row exactly as data prep wrote it before the type (keys and their order).
OURS = {"index": 7, "input": "Who directed Zorvan?", "answers": ["Miro Tal"], "context": "Document 1:\nZorvan\nBy Miro Tal.",
        "num_docs": 1, "id": "q7_L1", "question": "Who directed Zorvan?", "dataset": "synthetic", "length": 1,
        "gold_paragraph_ids": [1], "evidence_order": [1], "meta": {"question_id": "q7", "type": "bridge"}}
MEMAGENT = {"index": 3, "input": "Which city?", "answers": ["Lyon"], "context": "Document 1:\nAlpha is in Lyon.", "num_docs": 200}
RULER = {"index": 0, "input": "What is the magic number?", "outputs": ["1234"], "context": "... 1234 ...", "length": 4096,
         "answer_prefix": " The magic number is"}


def test_our_rows_read_and_write_back_unchanged():
    record = Record.from_dict(OURS, "eval_1.json:1")
    assert list(record.to_dict().items()) == list(OURS.items())
    assert record.gold_paragraph_ids == (1,) and record.meta["type"] == "bridge"


def test_the_synthetic_builder_writes_through_the_type_and_eval_reads_the_same_sample():
    for row in build_synthetic_eval(num_questions=3, lengths=(20,), seed=0):
        assert Record.from_dict(row).to_dict() == row
        sample = Sample.from_record(row)
        assert sample.meta == {k: v for k, v in row.items() if k not in ("input", "answers", "context", "id", "question")}


@pytest.mark.parametrize(("row", "sample_id", "answers", "meta"), [
    (MEMAGENT, "3", ["Lyon"], {"index": 3, "num_docs": 200}),
    (RULER, "0", ["1234"], {"index": 0, "length": 4096, "answer_prefix": " The magic number is"}),
])
def test_sources_rows_read_with_their_own_fields_kept(row, sample_id, answers, meta):
    sample = Sample.from_record(row, "f.jsonl:1")
    assert (sample.id, sample.answers, sample.meta) == (sample_id, answers, meta)


@pytest.mark.parametrize(("edit", "message"), [
    ({"question": ["a", "list"], "input": None}, "field 'question' must be a string, got list"),
    ({"context": ""}, "field 'context' is empty"),
    ({"answers": ["the"]}, r"answers\[0\] = 'the' normalizes to nothing"),
    ({"length": "200"}, "field 'length' must be a positive integer"),
    ({"num_docs": 0}, "field 'num_docs' must be a positive integer"),
    ({"gold_paragraph_ids": ["1"]}, "field 'gold_paragraph_ids' must be a list of integers"),
    ({"meta": "bridge"}, "field 'meta' must be an object"),
    ({"id": None, "index": None}, "record has no id/index field"),
])
def test_a_bad_field_is_named_with_its_file_and_line(edit, message):
    with pytest.raises(DataError, match=f"^eval_1.json:4: .*{message}"):
        Sample.from_record({**OURS, **edit}, "eval_1.json:4")


def test_a_writer_cannot_build_a_record_a_reader_refuses():
    with pytest.raises(DataError, match="field 'context' is empty"):
        Record(id="q", question="Who?", answers=("Ann",), context=" ", source="packing q")


def test_the_verl_row_is_built_from_the_record():
    row = rl_row(OURS, "synthetic")
    assert row["extra_info"]["gold_paragraph_ids"] == [1] and row["extra_info"]["type"] == "bridge"
    assert row["reward_model"]["ground_truth"] == ["Miro Tal"] and row["prompt"][0]["content"] == OURS["question"]
    with pytest.raises(DataError, match="missing field 'num_docs'"):
        rl_row({k: v for k, v in OURS.items() if k != "num_docs"}, "synthetic")
