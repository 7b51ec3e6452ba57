"""Readers: HotpotQA, FlashRAG 2WikiMultiHopQA, MemAgent's eval files, the authors' release.

Each reader turns raw rows into `Question`s + a `Corpus` (see `data_prep.records`); the
`load_*` functions fetch the rows by name with `datasets.load_dataset` (real users), while
tests pass rows or local files in the same schemas. Field layouts, as the public reference
code reads them:

* ``hotpotqa/hotpot_qa`` "distractor": ``id``, ``question``, ``answer``, ``type``, ``level``,
  ``supporting_facts = {title: [...], sent_id: [...]}``, ``context = {title: [...],
  sentences: [[...]]}`` (the original JSON files use ``_id`` and lists of ``[title, sentences]``;
  both are accepted).
* ``RUC-NLPIR/FlashRAG_datasets`` "2wikimultihopqa" (dev split): ``id``, ``question``,
  ``golden_answers``, ``metadata.context = {title, content | sentences}``,
  ``metadata.supporting_facts = {title, sent_id}``, ``metadata.type``, ``metadata.evidences``
  (``[subject, relation, object]`` triples).
* MemAgent's ``BytedTsinghua-SIA/hotpotqa`` ``eval_{L}.json``: a list of ``{context, input,
  answers, num_docs, index}``; ``inNexus/parser_dataset`` holds ``hqa_val/eval_{L}.json``,
  ``2wiki_val/eval_{L}.json`` (same fields) and ``train/*.parquet`` (MemAgent's RL layout).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from parser.records.jsonl import read_records
from parser.records.sample import compat_row
from data_prep.records import (Corpus, DataError, Question, logical_order, paragraph_text, require, require_answers,
                               require_record, require_text, unique_ids)

HOTPOTQA = ("hotpotqa/hotpot_qa", "distractor")
FLASHRAG = ("RUC-NLPIR/FlashRAG_datasets", "2wikimultihopqa")
MEMAGENT_EVAL = "BytedTsinghua-SIA/hotpotqa"
PARSER_RELEASE = "inNexus/parser_dataset"
TRAIN_FILE = "train/hotpotqa_train_process_emb-select_llm-unable.parquet"


def _context_pairs(context: Any, source: str) -> list[tuple[str, Any]]:
    """(title, sentences) pairs from a columnar dict or a list of [title, sentences]."""
    if isinstance(context, dict):
        titles = context.get("title")
        sentences = context.get("sentences", context.get("content"))
        if titles is None or sentences is None:
            raise DataError(f"{source}: field 'context' needs 'title' and 'sentences' (or 'content')")
        if not isinstance(titles, list) or not isinstance(sentences, list):
            raise DataError(f"{source}: 'context.title' and its sentences must be lists")
        if len(titles) != len(sentences):
            raise DataError(f"{source}: 'context.title' has {len(titles)} items but the sentences have {len(sentences)}")
        pairs = list(zip(titles, sentences, strict=True))
    elif isinstance(context, list):
        for i, pair in enumerate(context):
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                raise DataError(f"{source}: 'context[{i}]' is not a [title, sentences] pair")
        pairs = [(t, s) for t, s in context]
    else:
        raise DataError(f"{source}: field 'context' has unexpected type {type(context).__name__}")
    for i, (title, body) in enumerate(pairs):
        if not isinstance(title, str):
            raise DataError(f"{source}: context title {i} must be a string, got {type(title).__name__}")
        if not (isinstance(body, str) or (isinstance(body, (list, tuple)) and all(isinstance(x, str) for x in body))):
            raise DataError(f"{source}: context paragraph {i} ({title!r}) must be a string or a list of sentence strings")
    return pairs


def _supporting_titles(facts: Any, source: str) -> list[str]:
    if isinstance(facts, dict):
        if "title" not in facts:
            raise DataError(f"{source}: field 'supporting_facts' has no 'title'")
        titles = facts["title"]
        if not isinstance(titles, list) or not all(isinstance(t, str) for t in titles):
            raise DataError(f"{source}: 'supporting_facts.title' must be a list of strings")
        return list(titles)
    if isinstance(facts, list):
        for i, fact in enumerate(facts):
            if not (isinstance(fact, (list, tuple)) and fact and isinstance(fact[0], str)):
                raise DataError(f"{source}: 'supporting_facts[{i}]' is not a [title, sentence_id] pair")
        return [f[0] for f in facts]
    raise DataError(f"{source}: field 'supporting_facts' has unexpected type {type(facts).__name__}")


def _build(row_id: str, index: int, question: str, answers: Sequence[str], context: Any, facts: Any, *,
           dataset: str, source: str, qtype: str | None, level: str | None,
           evidences: Iterable[Sequence[str]] = (), compat: bool = False, keep_missing_support: bool = False) -> Question | None:
    """One question, or None when a supporting title is missing from its context (ReMemR1 skips
    such a question; with `keep_missing_support`, MemAgent's reader keeps it, gold = the titles
    present). `compat`: the authors' readers keep a repeated paragraph twice and record every
    supporting fact's paragraph (`support`, ReMemR1's `evidence_idx`); else the first copy is kept."""
    pairs = _context_pairs(context, source)
    titles = [str(t) for t, _ in pairs]
    texts = [paragraph_text(t, s) for t, s in pairs]
    # A few source rows repeat a paragraph; keep the first copy so a packed sample has no duplicates.
    unique: dict[str, int] = {}
    for pos, text in enumerate(texts):
        unique.setdefault(text, pos)
    keep = list(range(len(texts))) if compat else sorted(unique.values())
    remap = {old: new for new, old in enumerate(keep)}
    support = _supporting_titles(facts, source)
    if not all(t in titles for t in support):
        if not keep_missing_support:
            return None
        support = [t for t in support if t in titles]
    first = (lambda pos: pos) if compat else (lambda pos: remap[unique[texts[pos]]])
    gold = tuple(dict.fromkeys(first(titles.index(t)) for t in support))
    kept_titles = [titles[i] for i in keep]
    if not isinstance(evidences, (list, tuple)) or not all(isinstance(e, (list, tuple)) for e in evidences):
        raise DataError(f"{source}: 'metadata.evidences' must be a list of [subject, relation, object] triples")
    evidences = tuple(tuple(str(x) for x in e) for e in evidences if len(e) == 3)
    if not isinstance(row_id, (str, int)) or isinstance(row_id, bool):
        raise DataError(f"{source}: field 'id' must be a string, got {type(row_id).__name__}")
    return Question(id=str(row_id), index=index, question=question, answers=tuple(answers),
                    paragraphs=tuple(texts[i] for i in keep), gold=gold,
                    logical=logical_order(kept_titles, gold, evidences), dataset=dataset,
                    qtype=qtype, level=level, evidences=evidences,
                    support=tuple(titles.index(t) for t in support) if compat else (), compat=compat)


def _all_paragraphs(rows: Sequence[dict[str, Any]], context_of: Any, source: str) -> list[str]:
    """Every paragraph of every row, kept or dropped: the authors build the distractor corpus
    before they drop a question (ReMemR1 `read_dataset`, MemAgent `read_hotpotqa`)."""
    return [paragraph_text(t, s) for i, row in enumerate(rows)
            for t, s in _context_pairs(context_of(row, f"{source} record {i}"), f"{source} record {i}")]


def read_hotpotqa(rows: Iterable[dict[str, Any]], source: str = "hotpotqa", compat: bool = False) -> tuple[list[Question], Corpus]:
    """HotpotQA rows (HF or original JSON layout) -> questions + the split's paragraph corpus.
    `compat`: MemAgent's reader (`taskutils/memory_data/processing.py` `read_hotpotqa`): every
    question kept (a missing supporting title too), repeated paragraphs kept, corpus from all rows."""
    questions, ids = [], []
    rows = list(rows)
    for i, row in enumerate(rows):
        where = f"{source} record {i}"
        row = require_record(row, where)
        row_id = row.get("id", row.get("_id"))
        if row_id is None:
            raise DataError(f"{where}: missing field 'id' (or '_id')")
        ids.append(str(row_id))
        q = _build(row_id, i, require_text(row, "question", where), require_answers([require(row, "answer", where)], "answer", where, compat),
                   require(row, "context", where), require(row, "supporting_facts", where), dataset="hotpotqa",
                   source=where, qtype=row.get("type"), level=row.get("level"), compat=compat, keep_missing_support=compat)
        if q is not None:
            questions.append(q)
    unique_ids(ids, source)
    extra = _all_paragraphs(rows, lambda row, where: require(row, "context", where), source) if compat else ()
    return questions, Corpus.from_questions(questions, extra)


def read_2wiki(rows: Iterable[dict[str, Any]], source: str = "2wikimultihopqa", dataset: str = "2wikimultihopqa",
               extra_paragraphs: Iterable[str] = (), compat: bool = False) -> tuple[list[Question], Corpus]:
    """FlashRAG 2Wiki rows -> questions (with evidence triples and logical order) + corpus.

    Questions get a trailing '?' if missing, as ReMemR1 does. `extra_paragraphs` widens the
    distractor corpus (the synthetic world passes its whole encyclopedia). `compat`: ReMemR1's
    reader (`taskutils/data_synthesis/process_test.py` `read_dataset`): the corpus from every row,
    a question with a missing supporting title skipped after that, `index` counting kept questions
    only, repeated paragraphs kept, `support` = every supporting fact's paragraph.
    """
    questions, ids = [], []
    rows = list(rows)
    for i, row in enumerate(rows):
        where = f"{source} record {i}"
        row = require_record(row, where)
        meta = require_record(require(row, "metadata", where), where + " field 'metadata'")
        text = require_text(row, "question", where).strip()
        if not text.endswith("?"):
            text += "?"
        answers = require_answers(require(row, "golden_answers", where), "golden_answers", where, compat)
        ids.append(str(require(row, "id", where)))
        q = _build(require(row, "id", where), len(questions) if compat else i, text, answers,
                   require(meta, "context", where + " metadata"), require(meta, "supporting_facts", where + " metadata"),
                   dataset=dataset, source=where, qtype=meta.get("type"), level=meta.get("level"),
                   evidences=meta.get("evidences") or (), compat=compat)
        if q is not None:
            questions.append(q)
    unique_ids(ids, source)
    if compat:
        context_of = lambda row, where: require(require_record(require(row, "metadata", where), where), "context", where)  # noqa: E731
        extra_paragraphs = [*extra_paragraphs, *_all_paragraphs(rows, context_of, source)]
    return questions, Corpus.from_questions(questions, extra_paragraphs)


def check_eval_rows(rows: Iterable[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """MemAgent-style eval rows, checked for the fields eval needs (errors name source and record)."""
    out = []
    for i, row in enumerate(rows):
        where = f"{source} record {i}"
        row = dict(require_record(row, where))
        require_text(row, "context", where)
        require_text(row, "input", where)
        if not isinstance(row.get("answers"), list):
            raise DataError(f"{where}: field 'answers' must be a list" if "answers" in row else f"{where}: missing field 'answers'")
        require_answers(row["answers"], "answers", where, compat_row(row))
        row.setdefault("num_docs", row.get("length"))
        row.setdefault("id", f"{row.get('index', i)}_L{row.get('num_docs')}")
        out.append(row)
    unique_ids((str(r["id"]) for r in out), source)
    return out


def read_eval_file(path: str | Path) -> list[dict[str, Any]]:
    """A local ``eval_{L}.json`` / JSONL file of eval rows."""
    return check_eval_rows(read_records(path), str(path))


# ----------------------------------------------------------------------------------------------
# By name from the hub (real users; tests never call these).

def load_hotpotqa(split: str = "validation", revision: str | None = None, compat: bool = False) -> tuple[list[Question], Corpus]:
    import datasets

    return read_hotpotqa(datasets.load_dataset(*HOTPOTQA, split=split, revision=revision), source=f"{HOTPOTQA[0]}:{split}",
                         compat=compat)


def load_2wiki(split: str = "dev", revision: str | None = None, compat: bool = False) -> tuple[list[Question], Corpus]:
    import datasets

    return read_2wiki(datasets.load_dataset(*FLASHRAG, split=split, revision=revision), source=f"{FLASHRAG[0]}/{FLASHRAG[1]}:{split}",
                      compat=compat)


def load_memagent_eval(length: int, revision: str | None = None) -> list[dict[str, Any]]:
    """MemAgent's released HotpotQA eval set at L paragraphs (the paper evaluates on exactly these)."""
    import datasets

    rows = datasets.load_dataset(MEMAGENT_EVAL, data_files=f"eval_{length}.json", split="train", revision=revision)
    return check_eval_rows(rows, f"{MEMAGENT_EVAL}/eval_{length}.json")


def load_parser_release(kind: str, length: int | None = None, revision: str | None = None) -> Any:
    """The authors' release: kind "hqa_val"/"2wiki_val" -> eval rows at L; "train" -> a datasets.Dataset
    (MemAgent's RL layout: data_source, prompt, context, ability, reward_model, extra_info)."""
    import datasets

    if kind == "train":
        return datasets.load_dataset(PARSER_RELEASE, data_files=TRAIN_FILE, split="train", revision=revision)
    if kind not in {"hqa_val", "2wiki_val"} or length is None:
        raise ValueError(f"kind must be 'train', or 'hqa_val'/'2wiki_val' with a length; got {kind!r}, {length}")
    name = f"{kind}/eval_{length}.json"
    return check_eval_rows(datasets.load_dataset(PARSER_RELEASE, data_files=name, split="train", revision=revision),
                           f"{PARSER_RELEASE}/{name}")
