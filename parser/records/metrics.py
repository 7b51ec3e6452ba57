"""Which metrics an eval row carries, how they aggregate, and which direction is better: the one
list of metric names (`ResultRow.scores` is keyed by it, the report reads `higher_is_better`).

The definitions live in `parser.text.reward` (one for training and eval); this file only declares
what eval reports. `sub_em` is the paper's table metric. The `_compat` variants reproduce the
MemAgent/ReMemR1 reference scorer (an empty normalized prediction is a Sub_EM hit, and so is
every prediction on a gold that normalizes to "", which only compat data keeps) so our
numbers can be set beside published ones; see `tests/test_eval_metrics_on_cpu.py`. One known
difference remains: the reference scores only `answers[0]`, the core takes the max over all
golds (identical on single-gold rows such as MemAgent's HotpotQA files).

`sub_em_release` is the authors' release's eval Sub_EM (release eval/eval.py), reported beside
ours for `method=parser_release`: it reads the whole lead completion (every turn, thinking
included; `completion_text`), scores a missing answer as the string "No answer found", and takes
the max with the last `**bold**` span of the completion. Rows without turns (baselines) are
scored on their answer alone.
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Callable, Sequence

from parser.records.trace import Trace
from parser.records.trajectory import Trajectory
from parser.text.release import strip_trailing_markers
from parser.text.reward import MEMAGENT_SCORER, exact_match, release_sub_em, sub_em


@dataclasses.dataclass(frozen=True)
class Metric:
    """A per-sample score. Tables average it over samples, then over runs (`run_averaged` below);
    the report reads `title` (its headers and row labels), `percent` (print 100 x mean) and
    `higher_is_better` (which value is the best in a column, bolded in the Markdown table)."""

    name: str
    fn: Callable[[str | None, Sequence[str], str | None], float]  # (prediction, golds, completion)
    title: str
    higher_is_better: bool = True
    percent: bool = True


def _release(prediction: str | None, golds: Sequence[str], completion: str | None) -> float:
    if completion is None:
        completion = f"<answer>{prediction}</answer>" if prediction else ""
    return release_sub_em(completion, golds)


METRICS: tuple[Metric, ...] = (
    Metric("sub_em", lambda p, g, c: sub_em(p, g), "Sub_EM"),
    Metric("em", lambda p, g, c: exact_match(p, g), "EM"),
    Metric("sub_em_compat", lambda p, g, c: sub_em(p, g, **MEMAGENT_SCORER), "Sub_EM, authors' scorer"),
    Metric("em_compat", lambda p, g, c: exact_match(p, g, **MEMAGENT_SCORER), "EM, authors' scorer"),
    Metric("sub_em_release", _release, "Sub_EM, release's scorer"),
)
PRIMARY = "sub_em"
BY_NAME = {m.name: m for m in METRICS}


def completion_text(trace: Trace | None) -> str | None:
    """The lead's whole completion as the release decodes it (turns joined, end markers stripped);
    None for a trace without turns."""
    if not isinstance(trace, Trajectory) or not trace.turns:
        return None
    return "".join(strip_trailing_markers(t.text) for t in trace.turns)


def score(prediction: str | None, golds: Sequence[str], completion: str | None = None) -> dict[str, float]:
    return {m.name: m.fn(prediction, list(golds), completion) for m in METRICS}


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def run_averaged(rows: Sequence[Any], value: Callable[[Any], float]) -> float:
    """Mean over samples within each run, then over runs (the paper's "average of 3 runs"), of
    `value(row)` for each row with a `run` (`methodcaller("score", PRIMARY)` on a `ResultRow`)."""
    by_run: dict[int, list[float]] = collections.defaultdict(list)
    for r in rows:
        by_run[r.run].append(float(value(r)))
    return mean([mean(v) for v in by_run.values()])
