"""The learning run's warm start: demonstrations recorded by the real episode engine against the
world readers over HTTP, and the pieces of the supervised phase.

    .venv/bin/pytest tests/test_learn_lead_on_cpu.py -q

The readers (loopback --reader world) stand in for SGLang subagents; the lead side is the
scripted demonstrator behind verl's server-manager contract.
"""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verl")

from data_prep.recipes import learn_sets  # noqa: E402
from parser.records.jsonl import read_records  # noqa: E402
from data_prep.synthetic_world import ONE_HOP  # noqa: E402
from parser.cli import warm_start  # noqa: E402
from parser.serving.loopback import start_loopback  # noqa: E402


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, tiny_tokenizer):
    out = tmp_path_factory.mktemp("learn")
    world = {"num_paragraphs": 1200, "own_paragraphs": 6}
    learn_sets(out_dir=str(out), train_world={"seed": 1, **world}, heldout_world={"seed": 2, **world},
               types=("compositional", "inference", "bridge", ONE_HOP), num_train=8, num_warmup=8, num_heldout=4,
               train_length=12, heldout_lengths=(12,))
    rows = read_records(out / "warmup.json")
    demo_rows, hops, weights = warm_start.demonstrations(rows, follow_up=0.4)
    with start_loopback("world", reader="world") as readers:
        settings, response_length = warm_start._settings(readers.url)
        settings.pop("warm_start")
        episodes = asyncio.run(warm_start.record(demo_rows, settings, tiny_tokenizer, response_length, hops))
    return demo_rows, hops, weights, episodes


def test_full_chains_reach_the_gold_and_premature_ones_answer_the_intermediate(recorded, tiny_tokenizer):
    demo_rows, hops, weights, episodes = recorded
    assert len(demo_rows) > 8 and sorted(set(weights)) == [0.4, 0.6, 1.0]
    for row, hop, episode in zip(demo_rows, hops, episodes, strict=True):
        chain = row["meta"]["evidences"]
        text = tiny_tokenizer.decode(episode.ids[episode.prompt_len:], skip_special_tokens=False)
        if hop is None:  # the whole chain: one query per hop, then the gold answer
            assert episode.reward == 1.0 and episode.turns == len(chain) + 1, text
            if len(chain) == 2:  # the second query names what the first finding returned
                assert f"<parameter=query>\n{warm_start.QUERY_TEMPLATES[chain[1][1]].format(chain[0][2])}" in text
        else:  # stopped after the first hop: answers the intermediate entity
            assert episode.reward == 0.0 and f"<answer> {chain[0][2]}</answer>" in text
        lead = [t for t, m in zip(episode.ids, episode.mask, strict=True) if m]
        assert "Query:" not in tiny_tokenizer.decode(lead)  # observations are never lead tokens


def test_answer_turn_copies_train_only_the_answer_after_the_last_finding(recorded, tiny_tokenizer):
    demo_rows, hops, weights, episodes = recorded
    copies, copy_weights = warm_start.answer_turn_copies(episodes, hops, weight=0.6)
    assert copy_weights == [0.6] * len(copies)
    full_chains = [(row, e) for row, h, e in zip(demo_rows, hops, episodes, strict=True) if h is None and len(row["meta"]["evidences"]) > 1]
    assert len(copies) == len(full_chains) > 0
    for (row, full), copy in zip(full_chains, copies, strict=True):
        assert copy.ids == full.ids and all(m <= f for m, f in zip(copy.mask, full.mask, strict=True))
        trained = tiny_tokenizer.decode([t for t, m in zip(copy.ids, copy.mask, strict=True) if m], skip_special_tokens=False)
        assert f"<answer> {row['meta']['evidences'][-1][2]}</answer>" in trained, trained
        assert "<tool_call>" not in trained  # neither query is trained, so nor is the decision to follow up
    assert warm_start.answer_turn_copies(episodes, hops, weight=0.0) == ([], [])


def test_copy_curriculum_lowers_the_copy_loss(tiny_tokenizer):
    from parser.offline import tiny_qwen3

    net = tiny_qwen3(tiny_tokenizer, seed=0).train()
    names = ["Kaerlor Vrithmus", "Zhu Kidri", "Bigren Pictures", "Ferry of Vrygayas", "Raklynd Vale"]
    losses = warm_start.copy_curriculum(net, tiny_tokenizer, names, steps=60, batch_size=8, lr=3e-3, seed=0,
                                        log_every=0)
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10


def test_fitted_tokenizer_keeps_every_lexicon_word_one_token():
    """With the name lexicon in its fitting text, the lead's BPE holds each word as one token after
    a space, so a name of an unseen world is two or three known tokens to copy."""
    from data_prep.synthetic_world import lexicon_words
    from parser.offline import byte_bpe_tokenizer

    words = lexicon_words(256)
    tokenizer = warm_start.fit_tokenizer([], byte_bpe_tokenizer(), ["Document 1\nSome prose about a city."], 1024,
                                         words=words)
    assert all(len(tokenizer.encode(" " + w, add_special_tokens=False)) == 1 for w in words)
