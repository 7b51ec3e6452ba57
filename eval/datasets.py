"""Turn a `dataset` config into the subsets an eval walks through: one per length or condition.

The paper's tables are indexed by document length (paragraphs L: 50 ... 6400) and its controlled
analyses by a condition (evidence position bin, forward/reverse order, middle distance). Both
become a `Subset`: a named list of `Sample`s that is timed as a whole, because latency is
reported as subset wall time / subset size. Files are read with `parser.records.jsonl.read_records` and
each row through the one record type (`parser.records.sample.Record`, via `Sample.from_record`); the
synthetic world is generated in-process by `data_prep`, so eval never re-implements a loader. `source` picks how:

- `synthetic`: `data_prep.build_synthetic_eval(num_questions, lengths, seed)`
- `files`: `path` with a `{length}` placeholder, one file per entry of `lengths`; or one file, one
  subset (`dataset=files`, your own records: docs/datasets.md)
- `conditions`: `subsets` maps condition name -> file (controlled sets; all rows share one L)
- `synthetic_controlled`: the controlled sets built in-process on the synthetic world
  (`data_prep.controlled.{position,order,distance}_sets`, chosen by `analysis`)

A data file is read whole (its rows, then its digest), so a file over `max_data_file_bytes`
(configs/eval/default.yaml: 2 GiB, about four times MemAgent's largest eval file by estimate: 128
documents of ~896K tokens at ~4 bytes a token) is refused by its size before a byte is read, naming the file, its size and the
setting to raise (`parser eval max_data_file_bytes=...`); a file under it reads as it always did.

Each subset also says where it came from (`source`: the file, or which synthetic set) and a
`digest` of its whole input (the file's bytes, or the generated rows), before `limit`: eval.run
records both so a resume can tell that the rows it would skip were computed on other inputs
(`eval.inputs`).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path
from typing import Any, Mapping

from parser.methods.base import Sample
from parser.records.sample import DataError


@dataclasses.dataclass
class Subset:
    dataset: str
    length: int  # paragraphs L of the packed documents
    condition: str | None  # controlled analyses only
    condition_index: int | None
    samples: list[Sample]
    source: str = ""  # the file the samples were read from, or which synthetic set
    digest: str = ""  # sha256 of the whole input (file bytes or generated rows), before `limit`

    @property
    def label(self) -> str:
        return f"{self.dataset} L={self.length}" + (f" {self.condition}" if self.condition else "")


BOUND_SETTING = "max_data_file_bytes"  # configs/eval/default.yaml: the one definition of the bound


@functools.cache
def default_max_file_bytes() -> int:
    """configs/eval/default.yaml's `max_data_file_bytes`, for callers that load subsets without an
    eval config (a bench, a test): the bound is defined there once."""
    from omegaconf import OmegaConf

    from parser.base.resources import config_dir

    return int(OmegaConf.load(config_dir("eval", "default.yaml"))[BOUND_SETTING])


def _read(path: str | Path, max_bytes: int) -> tuple[list[dict[str, Any]], str]:
    """The file's records and the sha256 of its bytes; a file over `max_bytes` is refused unread."""
    from parser.records.jsonl import read_records

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"eval data file {path} does not exist; build it with `parser data` "
                                f"or point dataset.path at it")
    if path.exists() and not path.is_dir() and not path.is_file():  # /dev/zero never ends; a pipe reads empty the second time
        raise DataError(f"eval data file {path}: a device, FIFO or socket, not a file; eval reads it twice (its rows, "
                        "then its fingerprint for resuming): save it to a file first")
    size = path.stat().st_size if path.is_file() else 0
    if size > max_bytes:
        raise DataError(f"eval data file {path}: {size:,} bytes, over {BOUND_SETTING}={max_bytes:,} (it is read whole "
                        f"into memory); to read it anyway, raise the bound: parser eval {BOUND_SETTING}={size}")
    records = read_records(path)  # first: it refuses a directory or a bad line, naming the file
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return records, digest.hexdigest()


def _digest_rows(records: list[dict[str, Any]]) -> str:
    """sha256 of generated rows (key order does not matter)."""
    import orjson

    digest = hashlib.sha256()
    for record in records:
        digest.update(orjson.dumps(record, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS))
    return digest.hexdigest()


def _samples(records: list[dict[str, Any]], source: str, limit: int | None) -> list[Sample]:
    samples = [Sample.from_record(r, source=f"{source}:{i + 1}") for i, r in enumerate(records)]
    ids = [s.id for s in samples]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"{source}: sample id {dup!r} appears more than once; results are keyed by id")
    return samples[:limit] if limit else samples


def _length_of(records: list[dict[str, Any]], source: str) -> int:
    lengths = {r.get("length", r.get("num_docs")) for r in records}
    if len(lengths) != 1 or None in lengths:
        raise ValueError(f"{source}: expected one `length` (or `num_docs`) shared by all rows, got {sorted(map(str, lengths))}")
    return int(lengths.pop())


def _file_subsets(name: str, path: str, lengths: Any, limit: int | None, max_bytes: int) -> list[Subset]:
    """One subset per length (a `{length}` placeholder in `path`), or the one file as one subset.
    Lengths that cannot apply are refused, never used as labels: `lengths` without a placeholder
    would evaluate one file under several lengths. (A row's own `length` may differ from its
    file's: RULER rows record the exact token count of a document built to about L tokens.)"""
    placeholder = "{length}" in path
    if placeholder and not lengths:
        raise ValueError(f"dataset.path {path!r} has a {{length}} placeholder: set dataset.lengths (e.g. [50, 100])")
    if lengths and not placeholder:
        raise ValueError(f"dataset.lengths={list(lengths)} needs a {{length}} placeholder in dataset.path ({path!r} "
                         "names one file, which would be evaluated once per length): drop dataset.lengths to "
                         "evaluate the file as one subset, or name one file per length")
    if not placeholder:
        records, digest = _read(path, max_bytes)
        return [Subset(name, _file_length(records, path), None, None, _samples(records, path, limit), path, digest)]
    subsets = []
    for L in lengths:
        file = path.format(length=L)
        records, digest = _read(file, max_bytes)
        subsets.append(Subset(name, int(L), None, None, _samples(records, file, limit), file, digest))
    return subsets


def _file_length(records: list[dict[str, Any]], source: str) -> int:
    """The length shared by a file's rows (`length` / `num_docs`), 0 when they give none."""
    if all(r.get("length", r.get("num_docs")) is None for r in records):
        return 0
    return _length_of(records, source)


def _condition_subsets(name: str, by_condition: dict[str, tuple[list[dict[str, Any]], str, str]],
                       limit: int | None) -> list[Subset]:
    """One subset per condition; result keys carry the condition, so ids may repeat across them."""
    return [Subset(name, _length_of(records, source), condition, i, _samples(records, source, limit), source, digest)
            for i, (condition, (records, source, digest)) in enumerate(by_condition.items())]


def load_subsets(cfg: Mapping[str, Any], limit: int | None = None, max_file_bytes: int | None = None) -> list[Subset]:
    """The subsets of the `dataset` section `cfg`; each data file at most `max_file_bytes`
    (None: configs/eval/default.yaml's `max_data_file_bytes`)."""
    max_bytes = default_max_file_bytes() if max_file_bytes is None else max_file_bytes
    name, source = cfg["name"], cfg.get("source", "files")
    if source == "synthetic":
        from data_prep import build_synthetic_eval

        lengths = [int(x) for x in cfg["lengths"]]
        rows = build_synthetic_eval(num_questions=int(cfg["num_questions"]), lengths=tuple(lengths), seed=int(cfg.get("seed", 0)))
        by_length: dict[int, list[dict[str, Any]]] = {L: [] for L in lengths}
        for row in rows:
            by_length[int(row["length"])].append(row)
        return [Subset(name, L, None, None, _samples(by_length[L], f"synthetic L={L}", limit), f"synthetic L={L}",
                       _digest_rows(by_length[L])) for L in lengths]
    if source == "files":
        return _file_subsets(name, str(cfg["path"]), cfg.get("lengths"), limit, max_bytes)
    if source == "conditions":
        by_condition = {}
        for condition, path in dict(cfg["subsets"]).items():
            records, digest = _read(path, max_bytes)
            by_condition[str(condition)] = (records, str(path), digest)
        return _condition_subsets(name, by_condition, limit)
    if source == "synthetic_controlled":
        from data_prep import controlled
        from data_prep.synthetic_world import synthetic_source

        analysis = cfg["analysis"]
        if analysis not in ("position", "order", "distance"):
            raise ValueError(f"dataset {name!r}: analysis must be position | order | distance, got {analysis!r}")
        options = dict(cfg.get("options") or {})
        seed = int(cfg.get("seed", 0))
        questions, corpus = synthetic_source(int(cfg["num_questions"]), seed=seed,
                                             num_paragraphs=int(cfg.get("num_paragraphs", 2000)))
        sets = getattr(controlled, f"{analysis}_sets")(questions, corpus, seed=seed, **options)
        return _condition_subsets(name, {c: (rows, f"synthetic {analysis} {c}", _digest_rows(rows)) for c, rows in sets.items()},
                                  limit)
    raise ValueError(f"dataset {name!r}: unknown source {source!r} (synthetic | files | conditions)")
