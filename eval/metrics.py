"""Which metrics an eval row carries, how they aggregate, and which direction is better.

The definitions live in `parser.reward` (one for training and eval); this file only declares
what eval reports. `sub_em` is the paper's table metric. The `_compat` variants reproduce the
MemAgent/ReMemR1 reference scorer (an empty normalized prediction is a Sub_EM hit) so our
numbers can be set beside published ones; see `tests/test_eval_metrics_on_cpu.py`. One known
difference remains: the reference scores only `answers[0]`, the core takes the max over all
golds (identical on single-gold rows such as MemAgent's HotpotQA files).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from parser.reward import exact_match, sub_em


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[[str | None, Sequence[str]], float]
    aggregation: str = "mean"  # per subset: mean over samples, then mean over runs
    higher_is_better: bool = True
    percent: bool = True  # tables print 100 x mean


METRICS: tuple[Metric, ...] = (
    Metric("sub_em", lambda p, g: sub_em(p, g)),
    Metric("em", lambda p, g: exact_match(p, g)),
    Metric("sub_em_compat", lambda p, g: sub_em(p, g, compat=True)),
    Metric("em_compat", lambda p, g: exact_match(p, g, compat=True)),
)
PRIMARY = "sub_em"


def score(prediction: str | None, golds: Sequence[str]) -> dict[str, float]:
    return {m.name: m.fn(prediction, list(golds)) for m in METRICS}
