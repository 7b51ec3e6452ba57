"""Controlled evidence layouts (paper §4.1): position, order and distance of the gold paragraphs.

Sequential memory agents are sensitive to *where* evidence sits; these sets vary one factor
and hold the rest fixed, so a method's accuracy curve isolates that factor.

* position: every gold paragraph at seeded random slots inside the [st, st+10] percentile
  window of an L-paragraph document (st = 0, 10, ..., 90). The non-gold paragraphs are the
  same sequence in every variant (remove the gold paragraphs from any two variants and the
  documents are identical), so a distractor's slot moves by at most the number of gold
  paragraphs.
* order: a 2Wiki bridge_comparison document with the gold paragraphs in logical order and the
  same document with them reversed: same slots, same distractors, only the gold assignment
  differs.
* distance: two gold paragraphs in logical order separated by exactly d distractors, with a
  fixed pad of `pad` (1,600) distractors before the first and after the second.

    >>> sets = position_sets(questions, corpus, length=6400, seed=0)   # {"st00": [rows], ...}
"""
from __future__ import annotations

import random
from typing import Any, Sequence

from tqdm.auto import tqdm

from data_prep.packing import derived_seed, draw_distractors, own_indices, pack, record_from_layout
from data_prep.records import Corpus, DataError, Question


def _split_gold(question: Question, corpus: Corpus, length: int, seed: int) -> tuple[list[int], list[int], list[int]]:
    """Pack once, then separate: (non-gold corpus indices in document order, gold slots, gold
    corpus indices in logical order)."""
    packed = pack(question, corpus, length, seed=seed)
    gold_slots = sorted(packed.logical_positions)
    gold_set = set(gold_slots)
    rest = [c for slot, c in enumerate(packed.order) if slot not in gold_set]
    logical = [packed.order[slot] for slot in packed.logical_positions]
    return rest, gold_slots, logical


def _row(question: Question, corpus: Corpus, order: list[int], logical_slots: list[int], variant: str,
         control: str, **meta: Any) -> dict[str, Any]:
    # logical_slots[i] holds question.logical[i]; the supporting-facts order follows from it.
    support_slots = [logical_slots[question.logical.index(g)] for g in question.gold]
    return record_from_layout(question, corpus, order, support_slots, logical_slots,
                              record_id=f"{question.id}_L{len(order)}_{variant}",
                              meta={"control": control, "variant": variant, **meta})


def position_sets(questions: Sequence[Question], corpus: Corpus, *, length: int = 6400, seed: int = 0,
                  starts: Sequence[int] = tuple(range(0, 100, 10)), width: int = 10) -> dict[str, list[dict[str, Any]]]:
    """{"st{st:02d}": rows}: gold paragraphs at random slots in the [st, st+width] percentile window."""
    out: dict[str, list[dict[str, Any]]] = {f"st{st:02d}": [] for st in starts}
    for q in tqdm(questions, desc="position sets", leave=False):
        rest, _, logical = _split_gold(q, corpus, length, seed)
        for st in starts:
            lo, hi = st * length // 100, min(length, (st + width) * length // 100)
            if hi - lo < len(logical):
                raise DataError(f"window [{st}, {st + width}]% of L={length} has {hi - lo} slots for {len(logical)} gold paragraphs")
            rng = random.Random(derived_seed(seed, q.id, length, "position", st))
            slots = sorted(rng.sample(range(lo, hi), len(logical)))
            gold_order = list(range(len(logical)))
            rng.shuffle(gold_order)  # which gold paragraph takes which slot
            order: list[int] = []
            it = iter(rest)
            at = dict(zip(slots, (logical[i] for i in gold_order), strict=True))
            for slot in range(length):
                order.append(at[slot] if slot in at else next(it))
            logical_slots = [slots[gold_order.index(i)] for i in range(len(logical))]
            out[f"st{st:02d}"].append(_row(q, corpus, order, logical_slots, f"st{st:02d}", "position",
                                           window_percentile=[st, st + width], window_slots=[lo, hi]))
    return out


def order_sets(questions: Sequence[Question], corpus: Corpus, *, length: int = 6400, seed: int = 0,
               qtype: str | None = "bridge_comparison") -> dict[str, list[dict[str, Any]]]:
    """{"ordered": rows, "reverse_ordered": rows}: the same document, gold in logical vs reversed order.

    Only questions whose evidence has a dependency (some gold paragraph must be read before
    another) are used; `qtype` restricts the type (2Wiki bridge_comparison, as in the paper).
    """
    out: dict[str, list[dict[str, Any]]] = {"ordered": [], "reverse_ordered": []}
    for q in tqdm(questions, desc="order sets", leave=False):
        if (qtype and q.qtype != qtype) or len(q.gold) < 2 or not q.evidences:
            continue
        rest, slots, logical = _split_gold(q, corpus, length, seed)
        for variant, gold_seq in (("ordered", logical), ("reverse_ordered", logical[::-1])):
            at = dict(zip(slots, gold_seq, strict=True))
            it = iter(rest)
            order = [at[slot] if slot in at else next(it) for slot in range(length)]
            logical_slots = [slots[gold_seq.index(c)] for c in logical]
            out[variant].append(_row(q, corpus, order, logical_slots, variant, "order"))
    return out


def distance_sets(questions: Sequence[Question], corpus: Corpus, *, distances: Sequence[int] = (0, 200, 800, 1600, 2400, 3200),
                  pad: int = 1600, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """{"d{d}": rows}: two gold paragraphs (logical order) with exactly d distractors between,
    `pad` distractors before and after; pads and the middle sequence are fixed per question."""
    out: dict[str, list[dict[str, Any]]] = {f"d{d}": [] for d in distances}
    for q in tqdm(questions, desc="distance sets", leave=False):
        if len(q.gold) != 2:
            continue
        own = own_indices(q, corpus)
        rng = random.Random(derived_seed(seed, q.id, "distance"))
        pool = draw_distractors(rng, len(corpus), set(own), 2 * pad + max(distances))
        before, after, middle = pool[:pad], pool[pad:2 * pad], pool[2 * pad:]
        first, second = (own[i] for i in q.logical)
        for d in distances:
            order = before + [first] + middle[:d] + [second] + after
            logical_slots = [pad, pad + d + 1]
            out[f"d{d}"].append(_row(q, corpus, order, logical_slots, f"d{d}", "distance", distance=d, pad=pad))
    return out
