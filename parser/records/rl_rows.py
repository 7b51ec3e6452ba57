"""One verl dataset row -> the one record type (`parser.records.sample.Record`: question, document, gold
answers, id), the same type data prep writes and eval reads.

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

from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from parser.records.sample import DataError, Record, check_text, require_answers


def _plain(value: Any) -> Any:
    """numpy scalars/arrays and DictConfigs from verl's batch -> plain Python."""
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    return value


def episode_inputs(row: Mapping[str, Any], source: str | None = None) -> Record:
    """Read question, document (`context`), gold answers and a document id from a verl dataset
    row, with the field rules data prep and the eval loader apply (`parser.records.sample`): text where
    text belongs, golds that can score, an id (it keys the subagents' prefix caches). Errors name
    `source` (default: the row's index) and the field."""
    extra = _plain(row.get("extra_info")) or {}
    if not isinstance(extra, dict):
        raise DataError(f"{source or 'dataset row'}: field 'extra_info' must be a mapping, got {type(extra).__name__}")
    index = _plain(row.get("index", extra.get("index", "")))
    where = source or f"dataset row index={index!r}"
    released = not extra.get("context")  # the release's layout: the document is a top-level column
    document = _plain(row.get("context")) if released else extra["context"]
    if document is None or document == "":
        raise DataError(f"{where}: the document is missing or empty (extra_info.context, or a top-level `context`)")
    document = check_text(document, "context" if released else "extra_info.context", where)
    question = extra.get("question")
    field = "extra_info.question"
    if not question:
        messages = [m for m in _plain(row.get("raw_prompt", row.get("prompt"))) or [] if isinstance(m, dict)]
        candidates = messages[:1] if released else [m for m in messages if m.get("role") == "user"]
        if not candidates:
            raise DataError(f"{where}: no question (neither extra_info.question nor a user message in `prompt`)")
        question, field = candidates[-1].get("content"), "prompt[].content"
    question = check_text(question, field, where)
    reward_model = _plain(row.get("reward_model")) or {}
    if not isinstance(reward_model, dict):
        raise DataError(f"{where}: field 'reward_model' must be a mapping, got {type(reward_model).__name__}")
    field = "reward_model.ground_truth" if "ground_truth" in reward_model else "extra_info.answers"
    golds = reward_model.get("ground_truth", extra.get("answers"))
    if golds is None or (isinstance(golds, (str, list, tuple)) and len(golds) == 0):
        raise DataError(f"{where}: no gold answers (reward_model.ground_truth / extra_info.answers)")
    golds = require_answers([golds], field, where)[0] if isinstance(golds, str) else require_answers(golds, field, where)
    doc_id = str(extra.get("id") or extra.get("doc_id") or index)
    if not doc_id:
        raise DataError(f"{where}: no document id (extra_info.id, extra_info.doc_id or index): the subagents' "
                        "prefix caches are keyed by it")
    return Record(id=doc_id, question=question, answers=tuple(golds), context=document,
                  index=index if isinstance(index, (int, str)) and index != "" else None, source=where)
