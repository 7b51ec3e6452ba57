"""InfMem's retrieval inside the document: BM25 (`rank_bm25.BM25Okapi`) over short token windows of
the same document the reader walks through, restated from the authors' evaluation code
(UCMP13753/InfMem @ 26f1766, `taskutils/memory_eval/utils/infmem.py`: `_build_retrieve_corpus_legacy`,
`_build_retrieve_corpus_enhanced`, `tokenize_legacy`, `tokenize_mixed`,
`bm25_retrieve_for_recurrent_chunk[_enhanced]` and the `bm25search_impl` closure of
`async_query_llm_multi_turn`; cases in tests/test_infmem_fidelity_on_cpu.py).

Two variants, as theirs (`bm25:` in configs/method/infmem.yaml; docs/fidelity.md says which is the
default and why):
- `legacy`: windows of `window` tokens inside each reading chunk, no overlap; whitespace tokens,
  lower-cased; every search returns the best 4 windows, whatever the planner asked and wherever they
  are (the current chunk included).
- `enhanced`: windows overlapping by `overlap` tokens; lower-case ASCII word tokens plus Chinese
  characters and character pairs; the query normalised (`rules.normalize_query`), `top_k` clamped
  (`rules.clamp_top_k`); windows of the chunk being read are skipped, at most `per_chunk` windows
  come from any one chunk, and a window whose token set overlaps a chosen one by Jaccard >
  `dedup_jaccard` is skipped, among the best `max(40, top_k * candidates)` windows; if that gives
  fewer than `top_k`, the rest come in score order with only the current chunk and repeats excluded.

Not `parser.engine.scorers.BM25Scorer`: bm25s with stop words ranks differently, and the released
checkpoint was evaluated on these rankings. Ties are broken by numpy's `argsort` and `argpartition`
exactly as theirs calls them. Builds in O(document tokens); each search scores every window.

    index = Bm25Index.build(ids, tokenizer.decode, chunk_size=5000, variant="enhanced")
    index.search("Who directed Vrystork?", top_k=8, question="...", current_chunk=3)
"""
from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any, Callable

import numpy as np

from parser.methods.infmem.rules import clamp_top_k, normalize_query

VARIANTS = ("legacy", "enhanced")


def windows(num_tokens: int, chunk_size: int, window: int, overlap: int | None) -> list[tuple[int, int, int]]:
    """(chunk index, start, end) of every retrieval window: each reading chunk of `chunk_size` tokens
    cut into `window`-token windows that never cross its end; consecutive windows overlap by
    `overlap` tokens (at most window - 1; None: no overlap, the legacy corpus), the last one ends
    at the chunk's end."""
    step = window if overlap is None else max(1, window - min(overlap, window - 1))
    found = []
    for chunk, start in enumerate(range(0, num_tokens, chunk_size)):
        end, pos = min(num_tokens, start + chunk_size), start
        while pos < end:
            found.append((chunk, pos, min(end, pos + window)))
            if pos + window >= end:
                break
            pos += step
    return found


def tokenize_legacy(text: str) -> list[str]:
    """Their `tokenize_legacy`: lower-cased, split at whitespace (punctuation stays on the word)."""
    return text.lower().split()


def tokenize_mixed(text: str) -> list[str]:
    """Their `tokenize_mixed`: lower-cased runs of [a-z0-9_] (accented letters split words), then
    every CJK ideograph of the text and every pair of consecutive ones."""
    text = text.lower()
    tokens = re.findall(r"[a-z0-9_]+", text)
    han = [ch for ch in text if "\u4e00" <= ch <= "\u9fff"]
    return tokens + han + [a + b for a, b in zip(han, han[1:], strict=False)]


def jaccard(a: list[str], b: list[str]) -> float:
    union = set(a) | set(b)
    return len(set(a) & set(b)) / len(union) if union else 0.0


@dataclasses.dataclass
class Bm25Index:
    """The windows of one document, their BM25 model, and the settings of the variant."""

    variant: str
    docs: list[str]
    chunk_of: list[int]
    tokens: list[list[str]]
    model: Any  # rank_bm25.BM25Okapi
    legacy_top_k: int = 4
    per_chunk: int = 2
    dedup_jaccard: float = 0.8
    candidates: int = 6

    @classmethod
    def build(cls, ids: list[int], decode: Callable[[list[int]], str], *, chunk_size: int, variant: str,
              window: int = 500, overlap: int = 100, **settings: Any) -> "Bm25Index":
        from rank_bm25 import BM25Okapi  # the `baselines` extra

        if variant not in VARIANTS:
            raise ValueError(f"infmem: bm25 must be one of {VARIANTS}, got {variant!r}")
        spans = windows(len(ids), chunk_size, window, None if variant == "legacy" else overlap)
        docs = [decode(ids[start:end]) for _, start, end in spans]
        tokens = [(tokenize_legacy if variant == "legacy" else tokenize_mixed)(d) for d in docs]
        # rank_bm25 divides by the number of windows: an empty document has none to search
        return cls(variant, docs, [c for c, _, _ in spans], tokens, BM25Okapi(tokens) if docs else None, **settings)

    def search(self, query: Any, top_k: Any, *, question: str, current_chunk: int) -> tuple[Any, int, list[str]]:
        """(query searched, top-k used, windows best first) for one `retrievesearch` call, as their
        `bm25search_impl` answers it. A legacy query that is not a string searches the question
        (theirs raises, which ends their whole run)."""
        if self.variant == "legacy":
            query = query if isinstance(query, str) else question
            return query, top_k, self._ranked(tokenize_legacy(query), self.legacy_top_k)
        query, top_k = normalize_query(query, question), clamp_top_k(top_k)
        return query, top_k, self._enhanced(tokenize_mixed(query), top_k, current_chunk)

    def _scores(self, q_tokens: list[str]) -> np.ndarray:
        return self.model.get_scores(q_tokens) if self.model is not None else np.zeros(0)

    def _ranked(self, q_tokens: list[str], top_k: int, exclude: int | None = None) -> list[str]:
        """`bm25_retrieve_for_recurrent_chunk`: the best `top_k`, skipping chunk `exclude`."""
        ranked = [i for i in np.argsort(-self._scores(q_tokens)) if self.chunk_of[i] != exclude]
        return [self.docs[i] for i in ranked[:top_k]]

    def _enhanced(self, q_tokens: list[str], top_k: int, exclude: int) -> list[str]:
        """`bm25_retrieve_for_recurrent_chunk_enhanced`."""
        scores = self._scores(q_tokens)
        if not q_tokens or len(scores) == 0:
            return []
        count = min(len(scores), max(40, top_k * self.candidates))
        pool = np.argpartition(-scores, count - 1)[:count]
        pool = pool[np.argsort(-scores[pool])]
        found: list[int] = []
        per_chunk: collections.Counter[int] = collections.Counter()
        for i in pool:
            chunk = self.chunk_of[i]
            if chunk == exclude or per_chunk[chunk] >= self.per_chunk:
                continue
            if any(jaccard(self.tokens[i], self.tokens[j]) > self.dedup_jaccard for j in found):
                continue
            found.append(i)
            per_chunk[chunk] += 1
            if len(found) >= top_k:
                return [self.docs[j] for j in found]
        results = [self.docs[j] for j in found]
        for i in np.argsort(-scores):
            if self.chunk_of[i] == exclude or self.docs[i] in results:
                continue
            results.append(self.docs[i])
            if len(results) >= top_k:
                break
        return results
