"""The CPU learning run's data and readers: held-out questions stay out of training, and the
world readers answer exactly what their chunk states.

    .venv/bin/pytest tests/test_learn_data_on_cpu.py -q

The readers (`parser.serving.world_reader`, served by the loopback worker) stand in for the
frozen SGLang subagents of a real run; the questions are `data_prep`'s synthetic world.
"""
from __future__ import annotations

import asyncio
import json

import pyarrow.parquet as pq
import pytest

from parser.records.jsonl import read_records
from data_prep.recipes import learn_sets
from data_prep.synthetic_world import ONE_HOP, synthetic_rows
from parser.text.chunking import render_paragraphs
from parser.serving.world_reader import QUERY_TEMPLATES, RELATIONS, read, reply_to_prompt

TYPES = ("compositional", "inference", "bridge", ONE_HOP)


def _document(row) -> str:
    context = row["metadata"]["context"]
    return render_paragraphs([t + "\n" + "".join(c) for t, c in zip(context["title"], context["content"], strict=True)])


@pytest.fixture(scope="module")
def world_rows():
    rows, _ = synthetic_rows(120, seed=3, num_paragraphs=800, types=TYPES)
    return rows


def test_reader_finds_every_hop_of_every_chain(world_rows):
    """Asked for each (entity, relation) of a question's evidence chain, in the words a lead uses,
    the reader of the whole document returns the chain's next entity: no relation is unreadable."""
    seen = set()
    for row in world_rows:
        document = _document(row)
        for subject, relation, value in row["metadata"]["evidences"]:
            finding = read(document, QUERY_TEMPLATES[relation].format(subject))
            assert finding is not None and finding["answer"] == value, (relation, subject, finding)
            assert value in finding["evidence"] and finding["evidence"] in document
            seen.add(relation)
    assert seen == set(RELATIONS)


def test_reader_abstains_without_the_named_paragraph(world_rows):
    row = world_rows[0]
    subject, relation, _ = row["metadata"]["evidences"][0]
    document = _document(row)
    assert read(document, QUERY_TEMPLATES[relation].format("Nobody Inparticular")) is None
    without = "\n\n".join(p for p in document.split("\n\n") if f"\n{subject}\n" not in p + "\n")
    assert read(without, QUERY_TEMPLATES[relation].format(subject)) is None
    assert read(document, f"Tell me about {subject}.") is None  # no relation asked


def test_a_whole_two_hop_question_gets_only_its_first_hop(world_rows):
    """The readers never hand over a two-hop answer: the question names one entity, whose own
    fact is the intermediate one. The lead must ask again with what came back."""
    row = next(r for r in world_rows if r["metadata"]["type"] == "compositional")
    (film, _, director), (_, _, birthplace) = row["metadata"]["evidences"]
    finding = read(_document(row), row["question"])
    assert finding["answer"] == director != birthplace


def test_loopback_world_reader_answers_the_rendered_subagent_prompt(world_rows, tiny_tokenizer):
    """Over HTTP, through the project's subagent reader and chunker, as the episode engine calls it."""
    from parser.serving.backends.http import HttpBackend
    from parser.text.chunking import chunk_document
    from parser.engine.readers.subagent import SubagentReader
    from parser.serving.loopback import start_loopback

    row = next(r for r in world_rows if r["metadata"]["type"] == "inference")
    subject, relation, father = row["metadata"]["evidences"][0]
    chunks = chunk_document(_document(row), tiny_tokenizer, 512)  # whole paragraphs, as in the run

    async def scatter(url: str):
        backend = HttpBackend(url, api="sglang")
        reader = SubagentReader(backend, tiny_tokenizer, max_new_tokens=64)
        try:
            return [await reader.read(QUERY_TEMPLATES[relation].format(subject), c, "doc") for c in chunks]
        finally:
            await backend.aclose()

    with start_loopback("world", reader="world") as server:
        replies = asyncio.run(scatter(server.url))
    answers = [json.loads(r.text)["answer"] for r in replies]
    assert len(chunks) > 2 and answers.count(father) == 1 and answers.count("unknown") == len(chunks) - 1
    assert json.loads(reply_to_prompt("no excerpt here")) == {"answer": "unknown"}


@pytest.fixture(scope="module")
def learn_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("learn")
    world = {"num_paragraphs": 1200, "own_paragraphs": 6}
    written = learn_sets(out_dir=str(out), train_world={"seed": 1, **world}, heldout_world={"seed": 2, **world},
                         types=TYPES, num_train=64, num_warmup=64, num_heldout=32, train_length=12,
                         heldout_lengths=(12, 24))
    return out, written


def test_learn_sets_hold_out_questions_and_entities(learn_data):
    out, written = learn_data
    train = pq.read_table(written["train"]).to_pylist()
    warmup = read_records(written["warmup"])
    heldout = {L: read_records(written[f"heldout_{L}"]) for L in (12, 24)}
    assert len(train) == 64 and len(warmup) == 64 and all(len(rows) == 32 for rows in heldout.values())
    assert len({r["extra_info"]["question"] for r in train}) == 64  # distinct training questions
    assert [r["question"] for r in heldout[12]] == [r["question"] for r in heldout[24]]  # same questions per L
    trained_text = "\n".join(r["extra_info"]["context"] for r in train) + "\n".join(r["context"] for r in warmup)
    trained_questions = {r["extra_info"]["question"] for r in train} | {r["question"] for r in warmup}
    for row in heldout[12]:
        assert row["question"] not in trained_questions
        for subject, _, value in row["meta"]["evidences"]:
            assert f"\n{subject}\n" not in trained_text and value not in trained_text.split("\n"), (subject, value)
    types = {r["meta"]["type"] for r in heldout[12]}
    assert {"compositional", "inference", "bridge", ONE_HOP} <= types
    # the two-hop chains: the second hop's subject is the first hop's answer
    for row in warmup:
        chain = row["meta"]["evidences"]
        if len(chain) == 2:
            assert chain[1][0] == chain[0][2]
    assert (out / "val.parquet").is_file() and (out / "train.parquet.card.json").is_file()


def test_lexicon_worlds_share_words_but_no_name():
    """`lexicon=N`: every name is made of whole words from one seeded list, the same for every
    world, so two worlds share words but (after learn_sets' filter) no held-out name is trained."""
    from data_prep.synthetic_world import World, lexicon_words

    words = set(lexicon_words(128))
    assert lexicon_words(128) == lexicon_words(128) and len(words) == 128
    one, two = World(300, seed=1, lexicon=128), World(300, seed=2, lexicon=128)
    for world in (one, two):
        for entity in world.people + world.cities:
            parts = [w for w in entity.name.split() if w != "Vale" and not w.isdigit()]  # "X Vale", "X 2"
            assert set(parts) <= words, entity.name
    assert {e.name for e in one.people} != {e.name for e in two.people}


def test_learn_sets_add_warmup_worlds_without_leaking_heldout_names(tmp_path):
    world = {"num_paragraphs": 600, "own_paragraphs": 6}
    written = learn_sets(out_dir=str(tmp_path), train_world={"seed": 1, **world}, heldout_world={"seed": 2, **world},
                         types=TYPES, num_train=8, num_warmup=8, num_heldout=8, train_length=12,
                         heldout_lengths=(12,), lexicon=128, warmup_worlds=(5, 6))
    warmup = read_records(written["warmup"])
    heldout = read_records(written["heldout_12"])
    assert len(warmup) == 24  # 8 from the training world, 8 from each extra world
    trained = "\n".join(r["context"] for r in warmup)
    for row in heldout:
        for subject, _, value in row["meta"]["evidences"]:
            assert f"\n{subject}\n" not in trained, subject
