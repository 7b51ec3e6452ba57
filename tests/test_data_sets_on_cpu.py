"""2Wiki evidence order, controlled sets, the synthetic world and the recipes, on fixtures.

    .venv/bin/pytest tests/test_data_sets_on_cpu.py -q
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from data_prep import build_synthetic_eval
from data_prep.controlled import distance_sets, order_sets, position_sets
from parser.records.jsonl import read_records
from data_prep.recipes import controlled, eval_grid
from data_prep.records import DataError
from data_prep.sources import read_2wiki, read_eval_file
from data_prep.synthetic_world import QUESTION_TYPES, synthetic_rows, synthetic_source
from parser.text.chunking import split_paragraphs
from parser.methods.base import Sample

FIXTURES = Path(__file__).parent / "fixtures" / "data"


def _docs(row):
    return {p.index: p.text.split("\n", 1)[1] for p in split_paragraphs(row["context"])}


def _title(row, doc_id):
    return _docs(row)[doc_id].split("\n")[0]


@pytest.fixture(scope="module")
def world():
    return synthetic_source(60, seed=2, num_paragraphs=2500)


# ---------------------------------------------------------------------------------------------
# FlashRAG 2Wiki schema

def test_2wiki_reader_fields_and_logical_order():
    questions, corpus = read_2wiki(read_records(FIXTURES / "flashrag_2wikimultihopqa_dev.jsonl"), source="fixture")
    by_type = {q.qtype: q for q in questions}
    assert set(by_type) == {"bridge_comparison", "compositional", "comparison", "inference"}
    bc = by_type["bridge_comparison"]
    assert bc.question.endswith("?"), "ReMemR1 appends a missing question mark"
    titles = [bc.paragraphs[i].split("\n")[0] for i in bc.logical]
    assert titles == ["Dune Harbor", "The Quiet Orchard", "Marta Keel", "Oren Vask"], "films (bridge) before directors"
    comp = by_type["compositional"]
    assert [comp.paragraphs[i].split("\n")[0] for i in comp.logical] == ["Salt Meridian", "Ivo Drass"]
    assert len(corpus) == sum(len(q.paragraphs) for q in questions)


def test_memagent_eval_file_loads_into_samples(tmp_path):
    rows = read_eval_file(FIXTURES / "memagent_eval_3.json")
    samples = [Sample.from_record(r) for r in rows]
    assert [s.id for s in samples] == ["17_L3", "42_L3"], "question index + length, like our own rows"
    assert [p.index for p in split_paragraphs(samples[0].context)] == [1, 2, 3]
    bad = tmp_path / "eval_3.json"
    bad.write_text('[{"input": "q", "answers": ["a"]}]')
    with pytest.raises(DataError, match=r"eval_3.json record 0: missing field 'context'"):
        read_eval_file(bad)


# ---------------------------------------------------------------------------------------------
# Controlled sets

def test_position_sets_windows_and_fixed_distractors(world):
    questions, corpus = world
    length = 400
    sets = position_sets(questions[:6], corpus, length=length, seed=1)
    assert list(sets) == [f"st{st:02d}" for st in range(0, 100, 10)]
    for key, rows in sets.items():
        st = int(key[2:])
        lo, hi = st * length // 100, (st + 10) * length // 100
        for row in rows:
            assert row["num_docs"] == length and len(split_paragraphs(row["context"])) == length
            assert all(lo < d <= hi for d in row["gold_paragraph_ids"]), (key, row["gold_paragraph_ids"])
    for i in range(6):  # removing the gold paragraphs leaves the same document in every variant
        rests = set()
        for rows in sets.values():
            docs = _docs(rows[i])
            rests.add(tuple(docs[d] for d in sorted(docs) if d not in rows[i]["gold_paragraph_ids"]))
        assert len(rests) == 1


def test_order_sets_reverse_the_logical_order(world):
    questions, corpus = world
    sets = order_sets(questions, corpus, length=300, seed=0)
    assert sets["ordered"] and len(sets["ordered"]) == len(sets["reverse_ordered"])
    for fwd, rev in zip(sets["ordered"], sets["reverse_ordered"], strict=True):
        assert fwd["meta"]["type"] == "bridge_comparison"
        assert fwd["gold_paragraph_ids"] == rev["gold_paragraph_ids"], "same slots"
        assert fwd["meta"]["evidence_layout"] == "logical" and rev["meta"]["evidence_layout"] == "reversed"
        assert fwd["evidence_order"] == sorted(fwd["evidence_order"])
        assert rev["evidence_order"] == sorted(rev["evidence_order"], reverse=True)
        logical_titles = [_title(fwd, d) for d in fwd["evidence_order"]]
        assert [_title(rev, d) for d in rev["evidence_order"]] == logical_titles, "the same paragraphs, in reasoning order"
        assert [_title(rev, d) for d in sorted(rev["gold_paragraph_ids"])] == logical_titles[::-1]
        f, r = _docs(fwd), _docs(rev)
        assert all(f[d] == r[d] for d in f if d not in fwd["gold_paragraph_ids"]), "distractors identical"


def test_distance_sets_are_exact(world):
    questions, corpus = world
    sets = distance_sets(questions, corpus, distances=(0, 3, 50), pad=40, seed=0)
    for d, rows in ((int(k[1:]), v) for k, v in sets.items()):
        assert rows
        for row in rows:
            first, second = row["evidence_order"]
            assert (first, second) == (41, 41 + d + 1), "pad before, exactly d between, logical order"
            assert row["num_docs"] == 40 + 2 + d + 40
    pads = {tuple(_docs(rows[0])[i] for i in range(1, 41)) for rows in sets.values()}
    assert len(pads) == 1, "the pad is fixed across distances"


# ---------------------------------------------------------------------------------------------
# Synthetic world

def test_synthetic_world_is_seeded_and_answerable():
    rows_a, paras_a = synthetic_rows(40, seed=7, num_paragraphs=1500)
    rows_b, paras_b = synthetic_rows(40, seed=7, num_paragraphs=1500)
    assert rows_a == rows_b and paras_a == paras_b
    assert synthetic_rows(40, seed=8, num_paragraphs=1500)[0] != rows_a
    assert {r["metadata"]["type"] for r in rows_a} == set(QUESTION_TYPES)
    for r in rows_a:
        ctx = r["metadata"]["context"]
        gold = r["metadata"]["supporting_facts"]["title"]
        gold_text = " ".join(t + " " + "".join(s) for t, s in zip(ctx["title"], ctx["content"], strict=True) if t in gold)
        assert r["golden_answers"][0] in gold_text, r["question"]
        assert len(ctx["title"]) == 10
    assert len(set(paras_a)) == len(paras_a) >= 1500 - 20


def test_build_synthetic_eval_one_call_and_scale():
    rows = build_synthetic_eval(num_questions=4, lengths=(50, 6400), seed=0)
    assert [r["num_docs"] for r in rows] == [50] * 4 + [6400] * 4
    assert [r["index"] for r in rows[:4]] == [r["index"] for r in rows[4:]], "same questions at every L"
    big = rows[-1]
    assert len(split_paragraphs(big["context"])) == 6400
    assert Sample.from_record(big).context == big["context"]


# ---------------------------------------------------------------------------------------------
# Recipes: files, cards, same vs per-length questions

def test_eval_grid_recipe_writes_files_and_cards(tmp_path):
    src = {"name": "synthetic", "num_questions": 12, "seed": 0, "num_paragraphs": 600}
    out = eval_grid(source=src, out_dir=str(tmp_path / "a"), lengths=[20, 40], num_questions=5, seed=0, parquet=True)
    rows20, rows40 = read_eval_file(out[20]), read_eval_file(out[40])
    assert [r["index"] for r in rows20] == [r["index"] for r in rows40]
    card = json.loads(Path(str(out[40]) + ".card.json").read_text())
    assert card["counts"]["rows"] == 5 and card["counts"]["paragraphs"] == 200 and card["config"]["seed"] == 0
    assert (tmp_path / "a" / "eval_40.parquet").exists()
    assert not list((tmp_path / "a").glob("*.tmp")), "no temp files left behind"
    per_l = eval_grid(source=src, out_dir=str(tmp_path / "b"), lengths=[20, 40], num_questions=5, seed=0, same_questions=False)
    assert [r["index"] for r in read_eval_file(per_l[20])] != [r["index"] for r in read_eval_file(per_l[40])]


def test_controlled_recipe_on_2wiki_fixture(tmp_path):
    src = {"name": "2wiki", "path": str(FIXTURES / "flashrag_2wikimultihopqa_dev.jsonl")}
    out = controlled(kind="order", source=src, out_dir=str(tmp_path), num_questions=None, length=14)
    assert sorted(p.name for p in out.values()) == ["eval_2wikimultihopqa_14_ordered.json", "eval_2wikimultihopqa_14_reverse_ordered.json"]
    with pytest.raises(DataError, match="qualifies"):
        controlled(kind="order", source=src, out_dir=str(tmp_path), num_questions=None, length=14, qtype="no_such_type")
