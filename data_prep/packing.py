"""Pack a question into an L-paragraph document: the MemAgent / ReMemR1 recipe, made reproducible.

The recipe (read from MemAgent's ``taskutils/memory_data/processing.py`` and ReMemR1's
``taskutils/data_synthesis/process_test.py``): keep *all* of the question's own paragraphs,
pad with distractors sampled without replacement from the split's corpus (excluding the
question's own paragraphs) up to L, shuffle, render ``Document {i}:\\n{paragraph}`` joined by
blank lines (`parser.text.chunking.render_paragraphs`).

Shuffling. The references call ``random.Random(4).shuffle`` on every sample, which applies the
*same* permutation to every sample of a given L: gold paragraphs (listed first before the
shuffle) land in the same slots in every sample, a shortcut a policy can learn. `compat=True`
reproduces that exactly, on questions read by the authors' readers (`data_prep.sources`, `compat`:
a repeated paragraph placed twice, `evidence_idx` one slot per supporting fact). The default draws the permutation (and the distractors) from a
generator seeded by ``sha256(seed, question id, L)``, so output is bit-identical across runs,
machines and worker counts (the references' global-RNG draws inside a process pool are not).

    >>> packed = pack(question, corpus, length=200, seed=0)
    >>> row = eval_record(question, packed, corpus)
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import itertools
import multiprocessing
import os
import random
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

from data_prep.records import Corpus, DataError, Question
from parser.text.chunking import render_paragraphs
from parser.records.sample import Record

COMPAT_SHUFFLE_SEED = 4  # the fixed seed of MemAgent's and ReMemR1's `random.Random(4).shuffle`


def derived_seed(*parts: Any) -> int:
    """A 64-bit seed from any parts; stable across Python versions and processes (unlike hash())."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def draw_distractors(rng: random.Random, corpus_size: int, exclude: set[int], k: int) -> list[int]:
    """k corpus indices, uniformly without replacement, none in `exclude`.

    Draws k + |exclude| indices and drops the excluded ones: removing fixed elements from a
    uniform random ordering leaves a uniform random ordering of the rest, so the first k are a
    uniform k-subset. O(k) instead of the references' O(corpus) allowed-list per sample.
    """
    available = corpus_size - len(exclude)
    if k > available:
        raise DataError(f"need {k} distractors but the corpus has only {available} paragraphs besides the question's own")
    picked = [i for i in rng.sample(range(corpus_size), min(corpus_size, k + len(exclude))) if i not in exclude]
    return picked[:k]


@dataclasses.dataclass(frozen=True)
class Packed:
    """A document layout: corpus indices in document order, and where the gold paragraphs went."""

    order: tuple[int, ...]  # corpus index of Document i+1
    gold_positions: tuple[int, ...]  # 0-based slots of the gold paragraphs, supporting-facts order
    logical_positions: tuple[int, ...]  # the same slots in logical (reasoning) order
    seed: int | None  # the per-sample seed (None in compat mode, which uses the fixed permutation)
    shuffle: str  # "per_sample" or "fixed_random4"


def own_indices(question: Question, corpus: Corpus) -> list[int]:
    return [corpus.index_of(p) for p in question.paragraphs]


def pack(question: Question, corpus: Corpus, length: int, *, seed: int, compat: bool = False) -> Packed:
    """Lay out `question` in a `length`-paragraph document (see the module docstring)."""
    own = own_indices(question, corpus)
    if length < len(own):
        raise DataError(f"{question.dataset} question {question.id!r}: L={length} is smaller than its {len(own)} own paragraphs")
    k = length - len(own)
    if compat:
        # The reference's exact calls: sample from the allowed list, then the fixed shuffle.
        rng = random.Random(derived_seed(seed, question.id, length))
        own_set = set(own)
        allowed = [i for i in range(len(corpus)) if i not in own_set]
        if k > len(allowed):
            raise DataError(f"need {k} distractors but the corpus has only {len(allowed)} besides question {question.id!r}'s own")
        docs = own + rng.sample(allowed, k)
        perm = list(range(length))
        random.Random(COMPAT_SHUFFLE_SEED).shuffle(perm)
        sample_seed, mode = None, "fixed_random4"
    else:
        sample_seed = derived_seed(seed, question.id, length)
        rng = random.Random(sample_seed)
        docs = own + draw_distractors(rng, len(corpus), set(own), k)
        perm = list(range(length))
        rng.shuffle(perm)
        mode = "per_sample"
    order = tuple(docs[i] for i in perm)
    where = {old: new for new, old in enumerate(perm)}  # old slot -> new slot
    gold = question.support if compat and question.support else question.gold  # ReMemR1: one slot per supporting fact
    return Packed(order, tuple(where[g] for g in gold), tuple(where[g] for g in question.logical), sample_seed, mode)


def evidence_meta(gold_positions: Sequence[int], logical_positions: Sequence[int]) -> dict[str, Any]:
    """ReMemR1's evidence fields (0-based `evidence_idx` in supporting order, `is_ordered`,
    `is_reverse_ordered`, `min_distance`) plus `evidence_layout` against the logical order."""
    ev = list(gold_positions)
    srt = sorted(ev)
    logical = list(logical_positions)
    if len(logical) < 2:
        layout = "single"
    elif logical == sorted(logical):
        layout = "logical"
    elif logical == sorted(logical, reverse=True):
        layout = "reversed"
    else:
        layout = "mixed"
    return {
        "evidence_idx": ev,
        "is_ordered": ev == srt,
        "is_reverse_ordered": ev == sorted(ev, reverse=True),
        "min_distance": min((b - a for a, b in itertools.pairwise(srt)), default=None),
        "evidence_layout": layout,
    }


def record_from_layout(question: Question, corpus: Corpus, order: Sequence[int], gold_positions: Sequence[int],
                       logical_positions: Sequence[int], *, record_id: str | None = None,
                       meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The eval row (`parser.records.sample.Record.to_dict`): MemAgent's fields (`index`, `input`, `answers`,
    `context`, `num_docs`) + ours; the record type checks it as it is written."""
    length = len(order)
    return Record(
        id=record_id or f"{question.id}_L{length}",
        question=question.question,
        answers=question.answers,
        context=render_paragraphs([corpus[i] for i in order]),
        index=question.index,
        dataset=question.dataset,
        length=length,
        num_docs=length,
        gold_paragraph_ids=tuple(sorted({p + 1 for p in gold_positions})),  # "Document {i}" numbers
        evidence_order=tuple(p + 1 for p in logical_positions),  # the same, in reasoning order
        meta={"question_id": question.id, "type": question.qtype, "level": question.level,
              **evidence_meta(gold_positions, logical_positions),
              # 2Wiki's (subject, relation, object) triples: the chain a correct answer follows
              **({"evidences": [list(t) for t in question.evidences]} if question.evidences else {}),
              **({"compat": True} if question.compat else {}),  # read as the authors do: a "" gold is kept
              **(meta or {})},
        source=f"{question.dataset} question {question.id!r}",
    ).to_dict()


def eval_record(question: Question, packed: Packed, corpus: Corpus, **meta: Any) -> dict[str, Any]:
    return record_from_layout(question, corpus, packed.order, packed.gold_positions, packed.logical_positions,
                              meta={"shuffle": packed.shuffle, "sample_seed": packed.seed, **meta})


# ----------------------------------------------------------------------------------------------
# Many samples, in parallel, with a progress bar. Workers get the corpus once (fork or pickle).

_STATE: dict[str, Any] = {}


def _init(questions: Sequence[Question], corpus: Corpus, seed: int, compat: bool) -> None:
    _STATE.update(questions=questions, corpus=corpus, seed=seed, compat=compat)


def _one(task: tuple[int, int]) -> dict[str, Any]:
    qi, length = task
    q, corpus = _STATE["questions"][qi], _STATE["corpus"]
    return eval_record(q, pack(q, corpus, length, seed=_STATE["seed"], compat=_STATE["compat"]), corpus)


def map_tasks(fn: Callable[[Any], Any], tasks: list[Any], init: Callable[..., None], init_args: tuple,
              workers: int, desc: str) -> list[Any]:
    """`[fn(t) for t in tasks]` in task order, on `workers` processes (0/1: in this process)."""
    if workers <= 1 or len(tasks) <= 1:
        init(*init_args)
        return [fn(t) for t in tqdm(tasks, desc=desc, leave=False)]
    # fork shares the corpus with workers for free; elsewhere it is pickled once per worker.
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=init, initargs=init_args) as pool:
        return list(tqdm(pool.map(fn, tasks, chunksize=max(1, len(tasks) // (workers * 8))), total=len(tasks), desc=desc, leave=False))


def build_grid(questions: Sequence[Question], corpus: Corpus, lengths: Sequence[int], *, seed: int = 0,
               compat: bool = False, workers: int = 0) -> dict[int, list[dict[str, Any]]]:
    """Pack every question at every L (the same questions at every L): ``{L: [eval rows]}``."""
    tasks = [(qi, length) for length in lengths for qi in range(len(questions))]
    workers = workers if workers >= 0 else (os.cpu_count() or 1)
    rows = map_tasks(_one, tasks, _init, (list(questions), corpus, seed, compat), workers, "packing")
    grid: dict[int, list[dict[str, Any]]] = {length: [] for length in lengths}
    for (_, length), row in zip(tasks, rows, strict=True):
        grid[length].append(row)
    return grid
