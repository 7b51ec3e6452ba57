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
    """A per-sample score. Tables average it over samples, then over runs (`eval.report.run_averaged`);
    the report reads `percent` (print 100 x mean) and `higher_is_better` (which value is the best
    in a column, bolded in the Markdown table)."""

    name: str
    fn: Callable[[str | None, Sequence[str]], float]
    higher_is_better: bool = True
    percent: bool = True


METRICS: tuple[Metric, ...] = (
    Metric("sub_em", lambda p, g: sub_em(p, g)),
    Metric("em", lambda p, g: exact_match(p, g)),
    Metric("sub_em_compat", lambda p, g: sub_em(p, g, compat=True)),
    Metric("em_compat", lambda p, g: exact_match(p, g, compat=True)),
)
PRIMARY = "sub_em"
BY_NAME = {m.name: m for m in METRICS}


def score(prediction: str | None, golds: Sequence[str]) -> dict[str, float]:
    return {m.name: m.fn(prediction, list(golds)) for m in METRICS}
