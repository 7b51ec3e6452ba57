"""Packing invariants on HotpotQA-schema fixtures: the MemAgent recipe, made reproducible.

    .venv/bin/pytest tests/test_data_packing_on_cpu.py -q
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from parser.records.jsonl import read_records
from data_prep.packing import build_grid, eval_record, pack
from data_prep.records import DataError
from data_prep.sources import read_hotpotqa
from parser.text.chunking import split_paragraphs
from parser.methods.base import Sample

FIXTURES = Path(__file__).parent / "fixtures" / "data"


@pytest.fixture(scope="module")
def hotpot():
    return read_hotpotqa(read_records(FIXTURES / "hotpotqa_distractor_validation.jsonl"), source="fixture")


def _paragraphs(row):
    return [p.text.split("\n", 1)[1] for p in split_paragraphs(row["context"])]


def test_reader_builds_memagent_paragraphs_and_sorted_corpus(hotpot):
    questions, corpus = hotpot
    raw = json.loads((FIXTURES / "hotpotqa_distractor_validation.jsonl").read_text().splitlines()[0])
    title, sentences = raw["context"]["title"][1], raw["context"]["sentences"][1]
    assert title + "\n" + "".join(sentences) in questions[0].paragraphs
    assert corpus.paragraphs == sorted(set(corpus.paragraphs))
    assert len(questions) == 6
    # supporting facts name a title twice (two sentences); gold is deduplicated, in first-mention order
    assert [questions[0].paragraphs[g].split("\n")[0] for g in questions[0].gold] == [raw["supporting_facts"]["title"][0], raw["supporting_facts"]["title"][1]]
    # the repeated paragraph of the last fixture question is kept once
    assert len(questions[5].paragraphs) == 4


def test_original_json_layout_reads_the_same(hotpot):
    questions, _ = hotpot
    orig, _ = read_hotpotqa(read_records(FIXTURES / "hotpot_dev_distractor_v1_sample.json"))
    assert [(q.id, q.paragraphs, q.gold) for q in orig] == [(q.id, q.paragraphs, q.gold) for q in questions[:2]]


@pytest.mark.parametrize("length", [4, 12, 20])
def test_pack_invariants(hotpot, length):
    questions, corpus = hotpot
    for q in questions:
        packed = pack(q, corpus, length, seed=3)
        row = eval_record(q, packed, corpus)
        paras = _paragraphs(row)
        assert len(paras) == length == row["num_docs"]
        assert len(set(paras)) == length, "no duplicate paragraphs"
        assert [p.index for p in split_paragraphs(row["context"])] == list(range(1, length + 1))
        for own in q.paragraphs:  # every own paragraph (gold included) exactly once
            assert list(packed.order).count(corpus.index_of(own)) == 1
        gold_texts = {q.paragraphs[g] for g in q.gold}
        docs = {p.index: p.text.split("\n", 1)[1] for p in split_paragraphs(row["context"])}
        assert {docs[i] for i in row["gold_paragraph_ids"]} == gold_texts
        assert sorted(row["evidence_order"]) == row["gold_paragraph_ids"]
        sample = Sample.from_record(row)
        assert sample.question == q.question and sample.answers == list(q.answers)


def test_pack_is_deterministic_across_runs_and_worker_counts(hotpot):
    questions, corpus = hotpot
    a = build_grid(questions, corpus, [8, 16], seed=5, workers=0)
    b = build_grid(questions, corpus, [8, 16], seed=5, workers=2)
    assert a == b
    c = build_grid(questions, corpus, [8, 16], seed=6, workers=0)
    assert a != c


def test_default_mode_varies_gold_slots_per_sample(hotpot):
    questions, corpus = hotpot
    slots = {tuple(pack(q, corpus, 20, seed=0).gold_positions) for q in questions if len(q.paragraphs) == 4}
    assert len(slots) > 1


def test_compat_mode_reproduces_the_fixed_random4_permutation(hotpot):
    questions, corpus = hotpot
    length = 20
    perm = list(range(length))
    random.Random(4).shuffle(perm)  # MemAgent / ReMemR1: random.Random(4).shuffle(...)
    for q in questions:
        packed = pack(q, corpus, length, seed=0, compat=True)
        own = [corpus.index_of(p) for p in q.paragraphs]
        # the reference lists own paragraphs first, then shuffles with the fixed permutation
        assert [packed.order[perm.index(i)] for i in range(len(own))] == own
        assert packed.gold_positions == tuple(perm.index(g) for g in q.gold)


def test_too_short_length_and_too_small_corpus_raise(hotpot):
    questions, corpus = hotpot
    with pytest.raises(DataError, match="smaller than its 4 own paragraphs"):
        pack(questions[0], corpus, 3, seed=0)
    with pytest.raises(DataError, match="distractors"):
        pack(questions[0], corpus, len(corpus) + 5, seed=0)


def test_bad_records_name_the_record_and_field(tmp_path):
    rows = read_records(FIXTURES / "hotpotqa_distractor_validation.jsonl")
    del rows[2]["supporting_facts"]
    with pytest.raises(DataError, match=r"fixture.jsonl record 2: missing field 'supporting_facts'"):
        read_hotpotqa(rows, source="fixture.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n{not json\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2"):
        read_records(bad)
