"""Eval rows -> verl's RL parquet, the training input of the ParSer agent loop.

verl's `RLHFDataset` reads ``prompt`` (chat messages) and passes every other column to the
agent loop named by ``agent_name``. The prompt holds the *question only*: the lead agent must
never see document text, and the system prompt is added by the agent loop from
`parser.engine.prompts`. The document travels in ``extra_info["context"]`` (``extra_info`` holds the
record's fields, read through `parser.records.sample.Record`), where the agent loop chunks it for the subagents; ``reward_model.ground_truth`` holds the gold answers.

    write_rl_parquet("data/train/hotpotqa_train.parquet", rows, data_source="hotpotqa")
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from parser.records.sample import DataError, Record
from parser.records.jsonl import atomic_path

AGENT_NAME = "parser_agent"
ABILITY = "long_context_qa"


def rl_row(row: dict[str, Any], data_source: str, split: str = "train", agent_name: str = AGENT_NAME) -> dict[str, Any]:
    """One verl row from one eval row (`data_prep.packing.record_from_layout`), for the agent
    loop `agent_name` (configs/train/agent_loop.yaml: parser_agent, or memagent_agent)."""
    record = Record.from_dict(row, f"{data_source} record {row.get('id', '?') if isinstance(row, dict) else '?'}")
    for name in ("index", "num_docs"):
        if getattr(record, name) is None:
            raise DataError(f"{record.source}: missing field {name!r} (a verl row keeps MemAgent's fields)")
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": record.question}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": list(record.answers)},
        "extra_info": {
            "index": int(record.index),
            "id": record.id,
            "split": split,
            "question": record.question,
            "answers": list(record.answers),
            "context": record.context,
            "num_docs": record.num_docs,
            "gold_paragraph_ids": list(record.gold_paragraph_ids or []),
            "evidence_order": list(record.evidence_order or []),
            "type": (record.meta or {}).get("type") or "",
        },
        "agent_name": agent_name,
    }


def write_rl_parquet(path: str | Path, rows: Iterable[dict[str, Any]], data_source: str, split: str = "train",
                     agent_name: str = AGENT_NAME) -> Path:
    """Write verl rows atomically (row groups of 256 keep peak memory flat for 32K x 28K-token rows)."""
    table = pa.Table.from_pylist([rl_row(r, data_source, split, agent_name) for r in rows])
    if table.num_rows == 0:
        raise DataError(f"{path}: no rows to write; an empty training table trains on nothing")
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, row_group_size=256)
    return Path(path)


def read_rl_parquet(path: str | Path) -> list[Any]:
    """A training parquet read row by row as the agent loop reads it (`parser.records.rl_rows`), in this
    project's layout or the authors' released one; errors name the row. For checking a file
    before a run: `read_rl_parquet("data/train/hotpotqa_train_process_emb-select_llm-unable.parquet")`."""
    from parser.records.rl_rows import episode_inputs

    rows = pq.read_table(path).to_pylist()
    if not rows:
        raise DataError(f"{path}: the parquet table has no rows; rebuild it (parser data) or point "
                        "data.train_files / data.val_files at another file")
    return [episode_inputs(row, source=f"{path} row {i}") for i, row in enumerate(rows)]
