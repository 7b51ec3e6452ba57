"""One verl dataset row -> the episode's inputs (question, document, gold answers, id).

Why a module of its own: the agent loop reads rows this way inside verl, and data_prep checks a
training parquet with the same function (`data_prep.verl_parquet.read_rl_parquet`) without
importing verl. Two layouts are read as they are:

* this project's (`data_prep.verl_parquet`): `extra_info.context` = the document,
  `extra_info.question` (or the last user message of `prompt`) = the question;
* the authors' released parquet (inNexus/parser_dataset train/, MemAgent's RL layout): a
  top-level `context` column and the question in `prompt[0]`, as the release reads it.

verl hands `prompt` over as `raw_prompt`; `reward_model.ground_truth` holds the gold answers.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf


@dataclasses.dataclass
class EpisodeInputs:
    """What the engine needs from one dataset row."""

    question: str
    document: str
    golds: Any
    doc_id: str


def _plain(value: Any) -> Any:
    """numpy scalars/arrays and DictConfigs from verl's batch -> plain Python."""
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    return value


def episode_inputs(row: Mapping[str, Any]) -> EpisodeInputs:
    """Read question, document, gold answers and a document id from a verl dataset row."""
    extra = _plain(row.get("extra_info")) or {}
    index = _plain(row.get("index", extra.get("index", "")))
    where = f"dataset row index={index!r}"
    released = not extra.get("context")  # the release's layout: the document is a top-level column
    document = _plain(row.get("context")) if released else extra["context"]
    if not document:
        raise ValueError(f"{where}: the document is missing or empty (extra_info.context, or a top-level `context`)")
    question = extra.get("question")
    if not question:
        messages = [m for m in _plain(row.get("raw_prompt", row.get("prompt"))) or [] if isinstance(m, dict)]
        candidates = messages[:1] if released else [m for m in messages if m.get("role") == "user"]
        if not candidates:
            raise ValueError(f"{where}: no question (neither extra_info.question nor a user message in `prompt`)")
        question = candidates[-1]["content"]
    reward_model = _plain(row.get("reward_model")) or {}
    golds = reward_model.get("ground_truth", extra.get("answers"))
    if golds is None or (not isinstance(golds, str) and len(golds) == 0):
        raise ValueError(f"{where}: no gold answers (reward_model.ground_truth / extra_info.answers)")
    doc_id = str(extra.get("id") or extra.get("doc_id") or index)
    return EpisodeInputs(question=str(question), document=str(document), golds=golds, doc_id=doc_id)
