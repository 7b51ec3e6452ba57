"""What a run directory's rows were computed from, and the refusal when that has changed.

A resumed eval skips every (dataset, length, condition, run, sample id) key already in the
store. That is only right if those rows came from the same inputs: the same dataset (each
file's bytes, or the synthetic world's generated rows), the same method config (episode and
reader included) and the same seed. Otherwise a re-run after a dataset file was replaced (new
ids) or edited (same ids, new questions) would report the old rows as this run's. So the
manifest keeps a fingerprint of the inputs (`fingerprint`), and a run whose inputs differ from
the recorded ones where rows exist stops with `InputsChanged`, naming the file or config key.

What is not a change: more of the same inputs (a larger `limit`, another length's file, more
runs), and the knobs in `OPERATIONAL`, which say how calls are made (deadlines, retries,
concurrency), not what is computed.

    current = fingerprint(cfg, subsets)
    check_unchanged(run_dir, provenance.read_manifest(run_dir), current, store.rows())
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from eval.datasets import Subset
from parser.records.result import ResultRow

# Method-config keys (at any depth: the episode, the reader's episode) that do not change results.
OPERATIONAL = frozenset({"max_concurrency", "request_timeout_s", "max_attempts", "retry_backoff_s", "retry"})


class InputsChanged(ValueError):
    """The rows in a run directory were computed on other inputs than this run's."""


def subset_key(dataset: str, length: int, condition: str | None) -> str:
    return f"{dataset}/L{length}" + (f"/{condition}" if condition is not None else "")


def fingerprint(cfg: dict[str, Any], subsets: list[Subset]) -> dict[str, Any]:
    """The inputs of this run: the method config (less `OPERATIONAL`), the seed, the dataset
    section (to explain a change), and each subset's source and digest."""
    return {
        "method": _without_operational(cfg["method"]),
        "seed": cfg["seed"],
        "dataset": cfg["dataset"],
        "subsets": {subset_key(s.dataset, s.length, s.condition): {"source": s.source, "sha256": s.digest} for s in subsets},
    }


def check_unchanged(run_dir: str | Path, recorded: dict[str, Any] | None, current: dict[str, Any],
                    rows: Iterable[ResultRow]) -> dict[str, Any]:
    """Raise `InputsChanged` if rows exist that were computed on other inputs; otherwise return
    the fingerprint to record (the recorded subsets plus this run's)."""
    rows = list(rows)
    if recorded is None:
        if rows:
            print(f"[eval] {run_dir}: its {len(rows)} rows predate input fingerprints (an older eval.run); they are "
                  "trusted by key, and this run's inputs are recorded from now on")
        return current
    per_subset: dict[str, int] = {}
    for row in rows:
        key = subset_key(row.dataset, row.length, row.condition)
        per_subset[key] = per_subset.get(key, 0) + 1
    problems = []
    if rows:
        problems += _diff({"method": recorded["method"], "seed": recorded["seed"]},
                          {"method": current["method"], "seed": current["seed"]})
    explain = "; ".join(_diff({"dataset": recorded.get("dataset")}, {"dataset": current["dataset"]}))
    for key, now in current["subsets"].items():
        before = recorded["subsets"].get(key)
        if before is None or before["sha256"] == now["sha256"] or not per_subset.get(key):
            continue
        moved = f" (was {before['source']})" if before["source"] != now["source"] else ""
        problems.append(f"{now['source']}{moved} changed since its {per_subset[key]} rows were written "
                        f"(sha256 {before['sha256'][:12]} -> {now['sha256'][:12]}" + (f"; {explain}" if explain else "") + ")")
    if problems:
        raise InputsChanged(
            f"{run_dir}: the inputs differ from those its rows were computed on, so resuming would report old rows "
            "as this run's:\n  - " + "\n  - ".join(problems) + "\nGive this run its own out_dir, or delete "
            f"{Path(run_dir) / 'results.jsonl'} to start this one over."
        )
    return {**current, "subsets": {**recorded["subsets"], **current["subsets"]}}


def _without_operational(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_operational(v) for k, v in node.items() if k not in OPERATIONAL}
    return node


def _diff(before: Any, after: Any, path: str = "") -> list[str]:
    """`dotted.key: old -> new` for every leaf that differs."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for key in sorted(set(before) | set(after), key=str):
            out += _diff(before.get(key), after.get(key), f"{path}.{key}" if path else str(key))
        return out
    return [] if before == after else [f"{path}: {before!r} -> {after!r}"]
