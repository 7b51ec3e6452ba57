"""RULER tasks as declared data, and the loader for their `eval_{task}_{length}.json` files.

The paper's out-of-distribution check (Appendix B.2) runs ParSer on the RULER test files
MemAgent built (``taskutils/memory_data/ruler_data_prepare.sh`` in BytedTsinghua-SIA/MemAgent,
itself a port of NVIDIA/RULER's ``synthetic.yaml`` + ``constants.py``). MemAgent moved the
context out of RULER's prompt template, so a row is::

    {"index": 0, "input": <question, no context>, "context": <haystack>, "outputs": [gold, ...],
     "answer_prefix": <RULER's answer prefix>, "length": <tokens of input + context + tokens_to_generate>}

(`qa_*` rows carry no `length`: MemAgent's qa script drops it.) `parser.methods.Sample.from_record`
reads these rows unchanged: the question is `input`, the golds are `outputs`, the id is `index`.
The strings below (templates, needle, answer prefixes, including the reference's "assgined"
typo) are kept verbatim so our generated files read like MemAgent's.

    >>> rows = load_ruler_file("data/ruler/eval_niah_single_1_8192.json")
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from data_prep.records import DataError

# The seven lengths MemAgent released (tokens of its Qwen2.5 tokenizer), 128 samples each.
LENGTHS = (8192, 16384, 32768, 65536, 131072, 262144, 524288)

NIAH_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NIAH_TEMPLATE = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
                 "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?")
# RULER rewrites the template with str.replace when one value is asked for; this is its result.
NIAH_TEMPLATE_SINGLE = ("A special magic {type_needle_v} is hidden within the following text. Make sure to memorize it. "
                        "What is the special magic {type_needle_v} for {query} mentioned in the provided text?")
NIAH_ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@dataclasses.dataclass(frozen=True)
class RulerTask:
    name: str
    kind: str  # niah | variable_tracking | freq_words_extraction | qa
    template: str
    answer_prefix: str
    tokens_to_generate: int  # counted into `length`, as in the reference
    args: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def is_qa(self) -> bool:
        return self.kind == "qa"


def _niah(name: str, haystack: str, k_type: str, v_type: str, k: int = 1, v: int = 1, q: int = 1) -> RulerTask:
    args = {"type_haystack": haystack, "type_needle_k": k_type, "type_needle_v": v_type,
            "num_needle_k": max(k, q), "num_needle_v": v, "num_needle_q": q}
    return RulerTask(name, "niah", NIAH_TEMPLATE, NIAH_ANSWER_PREFIX, 128, args)


TASKS: dict[str, RulerTask] = {t.name: t for t in (
    # haystack: repeat = the noise sentences; essay = prose (synthetic world paragraphs here,
    # Paul Graham essays in the reference); needle = distractor needles with other keys.
    _niah("niah_single_1", "repeat", "words", "numbers"),
    _niah("niah_single_2", "essay", "words", "numbers"),
    _niah("niah_single_3", "essay", "words", "uuids"),
    _niah("niah_multikey_1", "essay", "words", "numbers", k=4),
    _niah("niah_multikey_2", "needle", "words", "numbers"),
    _niah("niah_multikey_3", "needle", "uuids", "uuids"),
    _niah("niah_multivalue", "essay", "words", "numbers", v=4),
    _niah("niah_multiquery", "essay", "words", "numbers", q=4),
    RulerTask("vt", "variable_tracking",
              "Memorize and track the chain(s) of variable assignment hidden in the following text. "
              "Question: Find all variables that are assigned the value {query} in the text above.",
              " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
              "assgined the value {query}, they are: ",
              30, {"num_chains": 1, "num_hops": 4}),
    RulerTask("fwe", "freq_words_extraction",
              "Read the following coded text and track the frequency of each coded word. Find the three most "
              "frequently appeared coded words. Question: Do not provide any explanation. Please ignore the dots "
              "'....'. What are the three most frequently appeared words in the above coded text?",
              " Answer: According to the coded text above, the three most frequently appeared words are:",
              50, {"alpha": 2.0, "coded_wordlen": 6, "tokens_per_vocab_word": 50}),
    # The reference's qa_1 packs SQuAD paragraphs; ours packs synthetic-world paragraphs.
    RulerTask("qa_1", "qa", "Answer the question based on the given documents. {query}", " Answer:", 32),
)}


def get_task(name: str) -> RulerTask:
    if name not in TASKS:
        raise KeyError(f"unknown RULER task {name!r}; known: {', '.join(TASKS)}")
    return TASKS[name]


def ruler_file(data_dir: str | Path, task: str, length: int) -> Path:
    """MemAgent's file name: ``{data_dir}/eval_{task}_{length}.json``."""
    return Path(data_dir) / f"eval_{task}_{int(length)}.json"


def validate_record(record: Any, source: str, task: RulerTask | None = None) -> dict[str, Any]:
    """Check one row against the schema; errors name the source, the record and the field."""
    if not isinstance(record, dict):
        raise DataError(f"{source}: expected a JSON object, got {type(record).__name__}")
    where = f"{source} (index={record.get('index')!r})"
    for field, kind in (("index", int), ("input", str), ("outputs", list), ("answer_prefix", str)):
        if field not in record:
            raise DataError(f"{where}: missing field {field!r}")
        if not isinstance(record[field], kind) or isinstance(record[field], bool):
            raise DataError(f"{where}: field {field!r} should be {kind.__name__}, got {type(record[field]).__name__}")
    context = record.get("context")
    if isinstance(context, list):
        raise DataError(f"{where}: field 'context' holds document indices, not text (MemAgent stores >2M-token qa "
                        f"contexts that way); rebuild it from the source corpus first")
    if not isinstance(context, str) or not context.strip():
        raise DataError(f"{where}: field 'context' should be non-empty text")
    outputs = record["outputs"]
    if not outputs or not all(isinstance(o, str) and o for o in outputs):
        raise DataError(f"{where}: field 'outputs' should be a non-empty list of non-empty strings, got {outputs!r}")
    if "length" in record and (not isinstance(record["length"], int) or record["length"] <= 0):
        raise DataError(f"{where}: field 'length' should be a positive int, got {record['length']!r}")
    if "length" not in record and not (task and task.is_qa):
        raise DataError(f"{where}: missing field 'length' (only qa rows may omit it)")
    return record


def load_ruler_file(path: str | Path) -> list[dict[str, Any]]:
    """Read and validate a RULER eval file (JSON list, MemAgent's format, or JSONL).

    The task is taken from the file name when it follows ``eval_{task}_{length}.json``.
    """
    from parser.records.jsonl import read_records

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"RULER file {path} does not exist; generate it with `parser data ruler` "
                                f"or download MemAgent's release into that directory")
    task = next((t for n, t in TASKS.items() if path.stem.startswith(f"eval_{n}_")), None)
    rows = read_records(path)
    if not rows:
        raise DataError(f"{path}: file holds no records")
    records = [validate_record(r, f"{path}: record {i}", task) for i, r in enumerate(rows)]
    indices = [r["index"] for r in records]
    if len(set(indices)) != len(indices):
        dup = next(i for i in indices if indices.count(i) > 1)
        raise DataError(f"{path}: index {dup} appears more than once; results are keyed by it")
    return records
