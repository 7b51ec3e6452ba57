"""Dataset cards: what a built file came from, written last beside it.

Every output is written atomically (`parser.records.jsonl.atomic_path`: temp file, fsync, rename), and
the card is written after the file, so a card next to a file means the file is whole. The
readers and writers of records and the append-only store live in `parser.records.jsonl`, below both
data prep and eval.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any

from parser.records.jsonl import write_json


def token_stats(counts: list[int]) -> dict[str, float]:
    if not counts:
        return {}
    return {"min": min(counts), "max": max(counts), "mean": round(statistics.fmean(counts), 1),
            "median": statistics.median(counts), "total": sum(counts)}


def _git_revision() -> str | None:
    """The repository commit that produced the data (None outside a git checkout)."""
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def write_card(data_path: str | os.PathLike, *, recipe: str, config: dict[str, Any], counts: dict[str, Any],
               token_counts: list[int] | None = None, tokenizer: str | None = None,
               source: dict[str, Any] | None = None) -> Path:
    """Write ``<data_path>.card.json``: recipe, seeds/config, source revision, counts, token stats."""
    card = {
        "file": Path(data_path).name,
        "bytes": Path(data_path).stat().st_size,
        "recipe": recipe,
        "config": config,
        "source": source or {},
        "counts": counts,
        "tokens": {"tokenizer": tokenizer, **token_stats(token_counts or [])} if token_counts else None,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "code_revision": _git_revision(),
    }
    return write_json(f"{data_path}.card.json", json.loads(json.dumps(card, default=str)), indent=True)
