"""Scores behind the chunk orders: real all-MiniLM-L6-v2 (its PyPI package) and real BM25 (bm25s).

    .venv/bin/pytest tests/test_scorers_on_cpu.py -q

Nothing is faked: the embedder is the RAG baseline's CPU model, windowed past its 256 tokens;
the documents are the synthetic world's.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from parser.text.chunking import chunk_document
from parser.engine.ordering import order_by_scores
from parser.engine.scorers import BM25Scorer, EmbeddingScorer, build_scorer


@pytest.fixture(scope="module")
def minilm():
    from parser.serving.backends.embedder import build_embedder

    return build_embedder({"model": "minilm", "batch_size": 1})  # one text a batch: no padding, order-free numerics


@pytest.fixture(scope="module")
def sample(tiny_tokenizer):
    from data_prep.synthetic_world import build_synthetic_eval

    row = build_synthetic_eval(num_questions=1, lengths=(24,), seed=5)[0]
    chunks = [c.text for c in chunk_document(row["context"], tiny_tokenizer, 300)]
    return row, chunks


def gold_chunks(row, chunks):
    gold = [f"Document {i}:" for i in row["gold_paragraph_ids"]]
    return {k for k, text in enumerate(chunks) for g in gold if g in text}


def test_a_long_passage_is_embedded_by_windows_and_pooled(minilm):
    text = " ".join(f"Paragraph {i} names the river Quouvar and the city Criamorburg." for i in range(60))
    windows = minilm.windows(text)
    assert len(windows) > 2 and "".join(piece for piece, _ in windows) == text
    assert all(n <= minilm.window_tokens == 254 for _, n in windows)  # 256 minus [CLS] and [SEP]
    pieces = minilm._embed([piece for piece, _ in windows])
    weights = np.array([n for _, n in windows], dtype=np.float32)[:, None]
    expected = (pieces * weights).sum(0)
    got = minilm([text])[0]
    np.testing.assert_allclose(got, expected / np.linalg.norm(expected), atol=1e-6)
    assert not np.allclose(got, minilm._embed([text])[0], atol=1e-3)  # not the first 256 tokens alone
    short = "The river Quouvar flows north."
    np.testing.assert_allclose(minilm([short])[0], minilm._embed([short])[0], atol=1e-6)


def test_passages_are_embedded_once_per_content(minilm, monkeypatch):
    first = minilm(["the river Quouvar", "the city Criamorburg"])
    seen = []
    embed = minilm._embed
    monkeypatch.setattr(minilm, "_embed", lambda texts: seen.extend(texts) or embed(texts))
    again = minilm(["the city Criamorburg", "a new passage", "the river Quouvar", "a new passage"])
    assert seen == ["a new passage"]  # the other two come from the cache, the repeat is embedded once
    np.testing.assert_array_equal(again[[2, 0]], first)
    np.testing.assert_array_equal(again[1], again[3])


def test_embedding_scores_find_the_gold_chunk(minilm, sample):
    row, chunks = sample
    relevance, similarity = EmbeddingScorer(minilm).scores(row["question"], chunks)
    assert relevance.shape == (len(chunks),) and similarity.shape == (len(chunks), len(chunks))
    np.testing.assert_allclose(np.diag(similarity), 1.0, atol=1e-5)
    assert gold_chunks(row, chunks) & set(order_by_scores("dense", relevance, similarity)[:3])


def test_shuffled_chunks_are_read_in_the_same_order_of_contents(minilm, sample):
    row, chunks = sample
    scorer = EmbeddingScorer(minilm)
    perm = random.Random(0).sample(range(len(chunks)), len(chunks))
    shuffled = [chunks[p] for p in perm]
    scores, shuffled_scores = scorer.scores(row["question"], chunks), scorer.scores(row["question"], shuffled)
    for strategy in ("dense", "chow_liu", "dfs"):
        original = [chunks[i] for i in order_by_scores(strategy, *scores)]
        assert [shuffled[i] for i in order_by_scores(strategy, *shuffled_scores)] == original, strategy
    assert order_by_scores("chow_liu", *scores) != list(range(len(chunks)))  # the order really moved


def test_bm25_relevance_and_similarity():
    chunks = ["Silent Harbour is a film directed by Anna Vrys.", "Anna Vrys was born in Criamorburg in 1905.",
              "The lake lies north of the harbour.", "and the of"]
    relevance, similarity = BM25Scorer().scores("Where was Anna Vrys born?", chunks)
    assert int(np.argmax(relevance)) == 1 and relevance[3] == 0
    np.testing.assert_allclose(similarity, similarity.T)
    np.testing.assert_allclose(np.diag(similarity)[:3], 1.0)
    assert similarity[0, 1] > similarity[0, 2] > 0 and not similarity[3].any()  # stop words only: no terms
    assert order_by_scores("chow_liu", relevance, similarity) == [1, 0, 2, 3]
    assert BM25Scorer().scores("anything", ["the", "of"])[0].tolist() == [0.0, 0.0]


def test_build_scorer_says_what_is_missing():
    assert isinstance(build_scorer({"_target_": "parser.engine.scorers.BM25Scorer.from_config"}), BM25Scorer)
    with pytest.raises(ValueError, match="scorer.embedder"):
        build_scorer({}, models=None)  # the default scorer embeds
    with pytest.raises(ValueError, match="scorer: cannot import _target_ 'parser.engine.scorers.TfIdf'"):
        build_scorer({"_target_": "parser.engine.scorers.TfIdf"})
