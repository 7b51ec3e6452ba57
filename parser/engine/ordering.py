"""The order in which a sequential agent reads its chunks: document, dense, Chow–Liu tree, DFS.

Why it exists: a sequential reader (MemAgent, ReMemR1, Chain-of-Agents) passes one bounded
memory from chunk to chunk, so what reaches the answer depends on the reading order. Gupta et
al., "Chow–Liu ordering for long-context reasoning in Chain-of-Agents", keep the reader and
choose the order. Every sequential method takes its order from this one function, so
"MemAgent + CL-order" and "CoA (CL-order)" read a document in the same order. ParSer reads all
chunks at once and never asks for an order.

    order = order_chunks("chow_liu", chunk_vectors, query_vector)    # indices into the chunks
    order = order_by_scores("dense", relevance, similarity)          # scores from any scorer (BM25)

With relevance r_i = cos(query, chunk i) and similarity S_ij = cos(chunk i, chunk j) (rows are
L2-normalised, so inner product = cosine):

- `document`: 0, 1, ..., n-1 (today's behaviour of every sequential method).
- `dense`: decreasing r; equal r in document order.
- `chow_liu`: the maximum spanning tree of the complete graph weighted by S (the Chow–Liu tree,
  with S as the mutual-information proxy), read breadth-first from the root, the chunk with the
  highest r. The paper does not say in which order a node's children are read; our choice:
  decreasing weight of the edge to the parent, equal weights in document order. Where several
  spanning trees are maximal (tied edge weights), the tree is the one Kruskal's algorithm builds
  when equal edges are taken in document order of (i, j), so the result is always defined.
- `dfs` (the paper's ablation): depth-first on the complete graph from the same root, always to
  the most similar unvisited chunk. On a complete graph an unvisited neighbour always exists, so
  the walk never backtracks: it is the greedy nearest-neighbour chain. Equal S: document order.

Ties are the only way the document's own order enters `dense`, `chow_liu` and `dfs`: shuffle
the chunks and, without ties, the sequence of chunk contents read is the same — the property
that makes these orders independent of where the evidence sits. This module must never call a
model: the scorers that make the vectors live in `parser.engine.scorers`.
"""
from __future__ import annotations

import collections
from typing import Sequence

import numpy as np

STRATEGIES = ("document", "dense", "chow_liu", "dfs")
# Table rows (report labels), as the CL paper names the orders.
NAMES = {"document": "document", "dense": "dense", "chow_liu": "CL-order", "dfs": "DFS"}


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown chunk order {strategy!r}; known: {', '.join(STRATEGIES)}")
    return strategy


def order_label(method: str, strategy: str, show_document: bool = False) -> str:
    """The report row of a method reading in `strategy` order: `MemAgent (CL-order)`, `CoA (DFS)`.

    Document order keeps the bare name unless `show_document` (MemAgent stays the paper's
    `MemAgent`; CoA's four rows all name their order). Eval configs call it as the resolver
    `${order_label:CoA,${.order},true}`."""
    check_strategy(strategy)
    if strategy == "document" and not show_document:
        return method
    return f"{method} ({NAMES[strategy]})"


def order_suffix(strategy: str) -> str:
    """`""` for document order, else `_<strategy>`: keeps each order's eval run in its own folder."""
    return "" if check_strategy(strategy) == "document" else f"_{strategy}"


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms == 0, 1.0, norms)  # a zero vector stays zero: cosine 0 to everything


def order_chunks(strategy: str, chunk_vectors: np.ndarray | Sequence[Sequence[float]],
                 query_vector: np.ndarray | Sequence[float]) -> list[int]:
    """Chunk indices in reading order; vectors are L2-normalised here (cosine similarity)."""
    check_strategy(strategy)
    chunks = np.asarray(chunk_vectors, dtype=np.float64)
    query = np.asarray(query_vector, dtype=np.float64)
    if chunks.ndim != 2 or query.ndim != 1 or (len(chunks) and chunks.shape[1] != query.shape[0]):
        raise ValueError(f"order_chunks: expected chunk vectors (n, d) and a query vector (d,), got {chunks.shape} and {query.shape}")
    if not (np.isfinite(chunks).all() and np.isfinite(query).all()):
        raise ValueError("order_chunks: chunk or query vectors hold NaN or infinity")
    chunks, query = _unit_rows(chunks), _unit_rows(query)
    return order_by_scores(strategy, chunks @ query, chunks @ chunks.T)


def order_by_scores(strategy: str, relevance: np.ndarray | Sequence[float], similarity: np.ndarray | None) -> list[int]:
    """Chunk indices in reading order from query relevance (n,) and chunk–chunk similarity (n, n).

    `similarity` is symmetrised ((S + Sᵀ) / 2) and its diagonal ignored; only `chow_liu` and
    `dfs` read it, and only the order of its values matters (scale-free)."""
    check_strategy(strategy)
    relevance = np.asarray(relevance, dtype=np.float64)
    n = len(relevance)
    if strategy == "document" or n <= 1:
        return list(range(n))
    if not np.isfinite(relevance).all():
        raise ValueError("order_by_scores: relevance holds NaN or infinity")
    if strategy == "dense":
        return [int(i) for i in np.lexsort((np.arange(n), -relevance))]
    sim = np.asarray(similarity, dtype=np.float64)
    if sim.shape != (n, n) or not np.isfinite(sim).all():
        raise ValueError(f"order_by_scores: similarity must be a finite ({n}, {n}) matrix, got shape {sim.shape}")
    sim = (sim + sim.T) / 2
    root = int(np.lexsort((np.arange(n), -relevance))[0])
    if strategy == "dfs":
        return _greedy_chain(sim, root)
    return _breadth_first(sim, _maximum_spanning_tree(sim), root)


def _maximum_spanning_tree(sim: np.ndarray) -> list[list[int]]:
    """Adjacency lists of the maximum spanning tree of the complete graph weighted by `sim`.

    scipy's minimum_spanning_tree reads 0 as "no edge" and breaks ties as it likes, so each
    edge gets a distinct positive integer cost instead: its rank when edges are sorted by
    decreasing similarity, then by (i, j). The tree depends only on that order, so it is the
    maximum spanning tree of `sim`, with ties taken in document order.
    """
    from scipy.sparse.csgraph import minimum_spanning_tree

    n = len(sim)
    i, j = np.triu_indices(n, k=1)
    rank = np.empty(len(i), dtype=np.float64)
    rank[np.lexsort((j, i, -sim[i, j]))] = np.arange(1, len(i) + 1)
    cost = np.zeros((n, n))
    cost[i, j] = rank
    tree = minimum_spanning_tree(cost).tocoo()
    adjacency: list[list[int]] = [[] for _ in range(n)]
    for a, b in zip(tree.row.tolist(), tree.col.tolist(), strict=True):
        adjacency[a].append(b)
        adjacency[b].append(a)
    return adjacency


def _breadth_first(sim: np.ndarray, adjacency: list[list[int]], root: int) -> list[int]:
    order, seen, queue = [], {root}, collections.deque([root])
    while queue:
        node = queue.popleft()
        order.append(node)
        children = sorted((c for c in adjacency[node] if c not in seen), key=lambda c: (-sim[node, c], c))
        seen.update(children)
        queue.extend(children)
    return order


def _greedy_chain(sim: np.ndarray, root: int) -> list[int]:
    order, unvisited = [root], np.ones(len(sim), dtype=bool)
    unvisited[root] = False
    while unvisited.any():
        candidates = np.flatnonzero(unvisited)
        node = int(candidates[np.argmax(sim[order[-1], candidates])])  # argmax: first of equal values
        order.append(node)
        unvisited[node] = False
    return order
