"""What chunk orders are computed from: the question's relevance to each chunk, and chunk–chunk similarity.

`parser.engine.ordering` turns these scores into a reading order; this module makes them, from a
dense embedder or from BM25 (the CL paper compares both scorers). A scorer sees the question
and the chunks of one document and never calls a language model.

    scorer = build_scorer({"type": "embedder", "embedder": {"model": "minilm"}}, models)
    relevance, similarity = scorer.scores(question, chunks)
    order = order_by_scores("chow_liu", relevance, similarity)

- `embedder`: cosines of L2-normalised embeddings (`parser.serving.backends.embedder`: MiniLM on CPU,
  Qwen3-Embedding on GPU presets). The question is embedded as a query (with the model's query
  instruction), chunks as passages; a chunk longer than the embedder's window is embedded window
  by window and pooled (token-weighted mean of the windows' unit vectors). The models config's
  embedder is used if it has one, else the scorer's own `embedder` section.
- `bm25` (bm25s, Lucene's BM25 with English stop words): relevance = BM25(question, chunk i);
  similarity S_ij = BM25 of chunk j with chunk i as the query, divided by chunk i's score against
  itself (so a long chunk's many terms do not outweigh a short one's), then averaged over the
  two directions. A chunk with no indexable words scores 0 against everything.
"""
from __future__ import annotations

from typing import Any, Mapping, Protocol

import numpy as np


class Scorer(Protocol):
    def scores(self, question: str, chunks: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(relevance (n,), similarity (n, n)) for one document's chunks."""
        ...


class EmbeddingScorer:
    def __init__(self, embedder: Any):
        self.embedder = embedder

    def scores(self, question: str, chunks: list[str]) -> tuple[np.ndarray, np.ndarray]:
        vectors = np.asarray(self.embedder(chunks), dtype=np.float64)
        embed_queries = getattr(self.embedder, "queries", self.embedder)
        query = np.asarray(embed_queries([question]), dtype=np.float64)[0]
        return vectors @ query, vectors @ vectors.T


class BM25Scorer:
    def __init__(self, k1: float = 1.5, b: float = 0.75, stopwords: str | None = "english"):
        import bm25s  # the `baselines` extra

        self.bm25s, self.k1, self.b, self.stopwords = bm25s, k1, b, stopwords

    def _tokens(self, texts: list[str]) -> list[list[str]]:
        return self.bm25s.tokenize(texts, stopwords=self.stopwords, return_ids=False, show_progress=False)

    def scores(self, question: str, chunks: list[str]) -> tuple[np.ndarray, np.ndarray]:
        n = len(chunks)
        tokens = self._tokens(chunks)
        if not any(tokens):  # nothing to index (bm25s refuses an empty vocabulary)
            return np.zeros(n), np.zeros((n, n))
        index = self.bm25s.BM25(k1=self.k1, b=self.b)
        index.index(tokens, show_progress=False)

        def against(query: list[str]) -> np.ndarray:
            return np.asarray(index.get_scores(query), dtype=np.float64)[:n] if query else np.zeros(n)

        cross = np.stack([against(t) for t in tokens])
        self_scores = np.diag(cross).copy()
        cross /= np.where(self_scores > 0, self_scores, 1.0)[:, None]
        return against(self._tokens([question])[0]), (cross + cross.T) / 2


def build_scorer(cfg: Mapping[str, Any] | None, models: Any = None) -> Scorer:
    """`{type: embedder, embedder: {...}}` or `{type: bm25, k1:, b:}`; see the module docstring."""
    cfg = dict(cfg or {"type": "embedder"})
    kind = cfg.pop("type", "embedder")
    if kind == "bm25":
        return BM25Scorer(**cfg)
    if kind != "embedder":
        raise ValueError(f"scorer: type must be 'embedder' or 'bm25', got {kind!r}")
    embedder = getattr(models, "embedder", None)
    if embedder is None:
        if not cfg.get("embedder"):
            raise ValueError("scorer: type embedder needs an embedder: set models.embedder or the method's "
                             "scorer.embedder (e.g. {model: minilm})")
        from parser.serving.backends.embedder import build_embedder

        embedder = build_embedder(cfg["embedder"])
    return EmbeddingScorer(embedder)
