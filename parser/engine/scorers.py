"""What chunk orders are computed from: the question's relevance to each chunk, and chunk–chunk similarity.

`parser.engine.ordering` turns these scores into a reading order; this module makes them, from a
dense embedder or from BM25 (the CL paper compares both scorers). A scorer sees the question
and the chunks of one document and never calls a language model.

    scorer = build_scorer({"_target_": EMBEDDER, "embedder": {"model": "minilm"}}, models)
    relevance, similarity = scorer.scores(question, chunks)
    order = order_by_scores("chow_liu", relevance, similarity)

- `EmbeddingScorer.from_config` (the default): cosines of L2-normalised embeddings (`parser.serving.backends.embedder`: MiniLM on CPU,
  Qwen3-Embedding on GPU presets). The question is embedded as a query (with the model's query
  instruction), chunks as passages; a chunk longer than the embedder's window is embedded window
  by window and pooled (token-weighted mean of the windows' unit vectors). The models config's
  embedder is used if it has one, else the scorer's own `embedder` section.
- `BM25Scorer.from_config` (bm25s, Lucene's BM25 with English stop words): relevance = BM25(question, chunk i);
  similarity S_ij = BM25 of chunk j with chunk i as the query, divided by chunk i's score against
  itself (so a long chunk's many terms do not outweigh a short one's), then averaged over the
  two directions. A chunk with no indexable words scores 0 against everything.

A method config's `scorer:` names one by `_target_` (configs/method/coa.yaml); every scorer is built
as `from_config(models=..., embedder=..., **its settings)`, since the method configs compose an
`embedder` section into `scorer`. The old `type: embedder | bm25` still builds for one release,
with a FutureWarning.
"""
from __future__ import annotations

from typing import Any, Mapping, Protocol

import numpy as np

from parser.base.instantiate import build, with_target

EMBEDDER = "parser.engine.scorers.EmbeddingScorer.from_config"
# The old `type:` of a scorer section -> its `_target_` (kept for one release).
TYPE_ALIASES = {"type": {"embedder": EMBEDDER, "bm25": "parser.engine.scorers.BM25Scorer.from_config"}}


class Scorer(Protocol):
    def scores(self, question: str, chunks: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(relevance (n,), similarity (n, n)) for one document's chunks."""
        ...


class EmbeddingScorer:
    def __init__(self, embedder: Any):
        self.embedder = embedder

    @classmethod
    def from_config(cls, *, models: Any = None, embedder: Mapping[str, Any] | None = None) -> "EmbeddingScorer":
        """Over the models config's embedder if it has one, else this section's `embedder` (e.g. {model: minilm})."""
        shared = getattr(models, "embedder", None)
        if shared is not None:
            return cls(shared)
        if not embedder:
            raise ValueError("scorer: EmbeddingScorer needs an embedder: set models.embedder or the method's "
                             "scorer.embedder (e.g. {model: minilm})")
        from parser.serving.backends.embedder import build_embedder

        return cls(build_embedder(embedder))

    def scores(self, question: str, chunks: list[str]) -> tuple[np.ndarray, np.ndarray]:
        vectors = np.asarray(self.embedder(chunks), dtype=np.float64)
        embed_queries = getattr(self.embedder, "queries", self.embedder)
        query = np.asarray(embed_queries([question]), dtype=np.float64)[0]
        return vectors @ query, vectors @ vectors.T


class BM25Scorer:
    def __init__(self, k1: float = 1.5, b: float = 0.75, stopwords: str | None = "english"):
        import bm25s  # the `baselines` extra

        self.bm25s, self.k1, self.b, self.stopwords = bm25s, k1, b, stopwords

    @classmethod
    def from_config(cls, *, models: Any = None, embedder: Mapping[str, Any] | None = None, **settings: Any) -> "BM25Scorer":
        """BM25 reads no model: `models` and the `embedder` section the method configs compose in are
        not its (`method.scorer._target_=parser.engine.scorers.BM25Scorer.from_config` is the whole switch)."""
        return cls(**settings)

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
    """The scorer a method's `scorer:` section names (`_target_`; none: the embedding scorer), built
    with the method's `models`; see the module docstring."""
    cfg = with_target(cfg or {}, where="scorer", aliases=TYPE_ALIASES, default=EMBEDDER)
    return build(cfg, where="scorer", models=models)
