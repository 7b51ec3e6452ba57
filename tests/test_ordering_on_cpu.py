"""Chunk reading orders (parser.engine.ordering): hand-worked cases, independent references, shuffle invariance.

    .venv/bin/pytest tests/test_ordering_on_cpu.py -q

The references below are written from the definitions, in plain Python, without numpy's
matrix code or scipy: a brute-force search over every spanning tree (Prüfer sequences) for
small n, Prim's algorithm for larger n, and the greedy chain for DFS.
"""
from __future__ import annotations

import collections
import itertools
import math
import random

import numpy as np
import pytest

from parser.engine.ordering import STRATEGIES, order_by_scores, order_chunks, order_label, order_suffix


def sym(n: int, edges: dict[tuple[int, int], float], rest: float = 0.1) -> np.ndarray:
    s = np.full((n, n), rest)
    for (i, j), w in edges.items():
        s[i, j] = s[j, i] = w
    np.fill_diagonal(s, 1.0)
    return s


# Five chunks whose heavy edges form the tree 1-0-3-4 plus 1-2; chunk 3 is the most relevant.
FIVE = sym(5, {(0, 1): 0.9, (1, 2): 0.8, (0, 3): 0.7, (3, 4): 0.6, (2, 4): 0.3})
FIVE_RELEVANCE = [0.1, 0.2, 0.3, 0.9, 0.4]


# ----------------------------------------------------------------------------- hand-worked

def test_document_order_is_the_identity():
    assert order_by_scores("document", [0.3, 0.9, 0.1], None) == [0, 1, 2]
    assert order_chunks("document", np.eye(4), np.ones(4)) == [0, 1, 2, 3]


def test_dense_sorts_by_relevance_and_breaks_ties_by_position():
    assert order_by_scores("dense", [0.2, 0.9, 0.2, 0.5], None) == [1, 3, 0, 2]
    # cosine, not inner product: chunk 1 is long but points away from the query
    assert order_chunks("dense", [[1.0, 1.0], [10.0, -1.0], [1.0, 0.0]], [1.0, 1.0]) == [0, 2, 1]


def test_chow_liu_reads_the_tree_breadth_first_from_the_most_relevant_chunk():
    # tree edges 3-0 (0.7), 3-4 (0.6), 0-1 (0.9), 1-2 (0.8); from 3: its children 0 then 4, then 0's child 1, then 2
    assert order_by_scores("chow_liu", FIVE_RELEVANCE, FIVE) == [3, 0, 4, 1, 2]


def test_dfs_walks_to_the_most_similar_unvisited_chunk():
    # from 3: 0 (0.7 > 0.6), from 0: 1 (0.9), from 1: 2 (0.8), then the last one, 4
    assert order_by_scores("dfs", FIVE_RELEVANCE, FIVE) == [3, 0, 1, 2, 4]


def test_chow_liu_children_with_equal_edges_are_read_in_document_order():
    star = sym(4, {(0, 1): 0.5, (0, 2): 0.5, (0, 3): 0.5})
    assert order_by_scores("chow_liu", [0.9, 0.1, 0.1, 0.1], star) == [0, 1, 2, 3]
    uneven = sym(4, {(0, 1): 0.3, (0, 2): 0.5, (0, 3): 0.5})
    assert order_by_scores("chow_liu", [0.9, 0.1, 0.1, 0.1], uneven) == [0, 2, 3, 1]


def test_chow_liu_tied_trees_take_equal_edges_in_document_order():
    # every edge 0.5: Kruskal over (0,1), (0,2), (1,2) keeps 0-1 and 0-2; the other maximal trees,
    # 0-2-1 and 0-1-2 as paths, would read 0, 2, 1 from root 0 and 2, 1, 0 from root 2
    triangle = sym(3, {}, rest=0.5)
    assert order_by_scores("chow_liu", [0.9, 0.1, 0.1], triangle) == [0, 1, 2]
    assert order_by_scores("chow_liu", [0.1, 0.1, 0.9], triangle) == [2, 0, 1]


def test_equal_relevance_roots_at_the_earliest_chunk_and_dfs_ties_go_by_position():
    flat = sym(4, {}, rest=0.5)
    assert order_by_scores("dfs", [0.7, 0.7, 0.7, 0.7], flat) == [0, 1, 2, 3]
    assert order_by_scores("dense", [0.7, 0.7, 0.7, 0.7], flat) == [0, 1, 2, 3]


def test_two_dimensional_vectors_worked_by_hand():
    # unit vectors at 0°, 10°, 70°, 90°; cosine similarity is the cosine of the angle between them
    angles = [0, 10, 70, 90]
    vectors = [[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in angles]
    query = [math.cos(math.radians(85)), math.sin(math.radians(85))]
    # relevance: 90° is 5° away, 70° is 15°, 10° is 75°, 0° is 85°
    assert order_chunks("dense", vectors, query) == [3, 2, 1, 0]
    # tree = the path 0-10-70-90 (gaps 10, 60, 20 beat any skip); from 90: 70, then 10, then 0
    assert order_chunks("chow_liu", vectors, query) == [3, 2, 1, 0]
    # same walk greedily; a query at 5° roots the tree at 0° and reads it the other way
    assert order_chunks("dfs", vectors, query) == [3, 2, 1, 0]
    assert order_chunks("chow_liu", vectors, [1.0, 0.08]) == [0, 1, 2, 3]


def test_breadth_first_reads_siblings_before_the_greedy_chain_goes_deep():
    # centre (0), a near arm (1), a far point past it (2), an arm on the other side (3):
    # cos 0-1 .894, 0-3 .857, 1-2 .916, 0-2 .640, 1-3 .537, 2-3 .154 -> tree 2-1-0-3, root 0
    vectors = [[1, 0], [1, 0.5], [1, 1.2], [1, -0.6]]
    assert order_chunks("chow_liu", vectors, [1, 0]) == [0, 1, 3, 2]
    assert order_chunks("dfs", vectors, [1, 0]) == [0, 1, 2, 3]


def test_degenerate_inputs():
    assert order_chunks("chow_liu", np.zeros((0, 3)), np.ones(3)) == []
    assert order_chunks("dfs", [[1.0, 2.0]], [0.0, 1.0]) == [0]
    assert order_chunks("chow_liu", [[0.0, 0.0], [1.0, 0.0]], [1.0, 0.0]) == [1, 0]  # a zero vector: cosine 0


@pytest.mark.parametrize("bad, match", [
    (dict(strategy="random"), "unknown chunk order 'random'; known: document, dense, chow_liu, dfs"),
    (dict(chunk_vectors=[[1.0, 0.0]], query_vector=[1.0, 0.0, 0.0]), r"expected chunk vectors \(n, d\)"),
    (dict(chunk_vectors=[[math.nan, 0.0]]), "NaN"),
])
def test_bad_input_is_named(bad, match):
    args = {"strategy": "chow_liu", "chunk_vectors": [[1.0, 0.0]], "query_vector": [1.0, 0.0], **bad}
    with pytest.raises(ValueError, match=match):
        order_chunks(**args)
    with pytest.raises(ValueError, match=r"similarity must be a finite \(2, 2\) matrix"):
        order_by_scores("chow_liu", [0.1, 0.2], np.ones((3, 3)))


def test_report_labels_and_run_folders_name_the_order():
    assert order_label("MemAgent", "document") == "MemAgent" and order_label("MemAgent", "chow_liu") == "MemAgent (CL-order)"
    assert [order_label("CoA", s, True) for s in STRATEGIES] == ["CoA (document)", "CoA (dense)", "CoA (CL-order)", "CoA (DFS)"]
    assert order_suffix("document") == "" and order_suffix("dfs") == "_dfs"


# ----------------------------------------------------------------------------- references

def cosines(vectors: list[list[float]], query: list[float]) -> tuple[list[float], list[list[float]]]:
    unit = [[x / math.sqrt(math.fsum(v * v for v in row)) for x in row] for row in vectors]
    q = [x / math.sqrt(math.fsum(v * v for v in query)) for x in query]
    dot = lambda a, b: math.fsum(x * y for x, y in zip(a, b, strict=True))  # noqa: E731
    return [dot(u, q) for u in unit], [[dot(a, b) for b in unit] for a in unit]


def bfs(tree: set[tuple[int, int]], sim: list[list[float]], root: int) -> list[int]:
    neighbours = collections.defaultdict(list)
    for a, b in tree:
        neighbours[a].append(b)
        neighbours[b].append(a)
    order, seen, queue = [], {root}, collections.deque([root])
    while queue:
        node = queue.popleft()
        order.append(node)
        for child in sorted((c for c in neighbours[node] if c not in seen), key=lambda c: -sim[node][c]):
            seen.add(child)
            queue.append(child)
    return order


def prufer_trees(n: int):
    """Every labelled tree on n nodes, from its Prüfer sequence."""
    for seq in itertools.product(range(n), repeat=n - 2):
        degree = [1] * n
        for x in seq:
            degree[x] += 1
        edges = set()
        for x in seq:
            leaf = min(i for i in range(n) if degree[i] == 1)
            edges.add((min(leaf, x), max(leaf, x)))
            degree[leaf] -= 1
            degree[x] -= 1
        u, v = [i for i in range(n) if degree[i] == 1]
        edges.add((u, v))
        yield edges


def brute_force_tree(sim: list[list[float]]) -> set[tuple[int, int]]:
    return max(prufer_trees(len(sim)), key=lambda t: math.fsum(sim[a][b] for a, b in t))


def prim_tree(sim: list[list[float]]) -> set[tuple[int, int]]:
    n, inside, edges = len(sim), {0}, set()
    while len(inside) < n:
        a, b = max(((a, b) for a in inside for b in range(n) if b not in inside), key=lambda e: sim[e[0]][e[1]])
        edges.add((min(a, b), max(a, b)))
        inside.add(b)
    return edges


def reference(strategy: str, vectors: list[list[float]], query: list[float]) -> list[int]:
    relevance, sim = cosines(vectors, query)
    n = len(vectors)
    if strategy == "dense":
        return sorted(range(n), key=lambda i: -relevance[i])
    root = max(range(n), key=lambda i: relevance[i])
    if strategy == "dfs":
        order = [root]
        while len(order) < n:
            order.append(max((j for j in range(n) if j not in order), key=lambda j: sim[order[-1]][j]))
        return order
    return bfs(brute_force_tree(sim) if n <= 6 else prim_tree(sim), sim, root)


def random_case(seed: int, n: int) -> tuple[list[list[float]], list[float]]:
    rng = random.Random(seed)
    d = rng.randint(2, 12)
    return [[rng.gauss(0, 1) for _ in range(d)] for _ in range(n)], [rng.gauss(0, 1) for _ in range(d)]


@pytest.mark.parametrize("strategy", ["dense", "chow_liu", "dfs"])
@pytest.mark.parametrize("seed", range(40))
def test_matches_the_reference_on_random_vectors(strategy, seed):
    n = [2, 3, 4, 5, 6][seed % 5] if seed < 20 else 7 + seed  # brute force up to 6 chunks, Prim's beyond
    vectors, query = random_case(seed, n)
    assert order_chunks(strategy, vectors, query) == reference(strategy, vectors, query)


def test_scipy_tree_is_the_brute_force_maximum_on_every_small_case():
    from parser.engine.ordering import _maximum_spanning_tree

    for seed in range(30):
        vectors, query = random_case(1000 + seed, 6)
        _, sim = cosines(vectors, query)
        adjacency = _maximum_spanning_tree(np.array(sim))
        ours = {(min(a, b), max(a, b)) for a, nbrs in enumerate(adjacency) for b in nbrs}
        assert ours == brute_force_tree(sim)


# ----------------------------------------------------------------------------- invariance

@pytest.mark.parametrize("strategy", ["dense", "chow_liu", "dfs"])
@pytest.mark.parametrize("seed", range(10))
def test_the_contents_read_do_not_depend_on_the_documents_order(strategy, seed):
    vectors, query = random_case(seed, 25)
    perm = random.Random(seed).sample(range(25), 25)  # shuffled[k] is chunk perm[k]
    original = order_chunks(strategy, vectors, query)
    shuffled = order_chunks(strategy, [vectors[p] for p in perm], query)
    assert [perm[k] for k in shuffled] == original


def test_apart_from_ties_duplicates_are_read_in_document_order():
    a, b, c = [1.0, 0.0], [0.6, 0.8], [0.0, 1.0]
    # chunks 1 and 3 are the same text: which copy comes first follows the document, the contents do not change
    for strategy in ("dense", "chow_liu", "dfs"):
        order = order_chunks(strategy, [a, b, c, b], [0.6, 0.75])
        assert order.index(1) < order.index(3)
        contents = [["a", "b", "c", "b"][i] for i in order]
        reordered = order_chunks(strategy, [b, c, b, a], [0.6, 0.75])
        assert [["b", "c", "b", "a"][i] for i in reordered] == contents
