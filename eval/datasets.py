"""Turn a `dataset` config into the subsets an eval walks through: one per length or condition.

The paper's tables are indexed by document length (paragraphs L: 50 ... 6400) and its controlled
analyses by a condition (evidence position bin, forward/reverse order, middle distance). Both
become a `Subset`: a named list of `Sample`s that is timed as a whole, because latency is
reported as subset wall time / subset size. Records are read with `data_prep` (the synthetic
world is generated in-process; files are MemAgent-format JSON or JSONL), so eval never
re-implements a loader. `source` picks how:

- `synthetic`: `data_prep.build_synthetic_eval(num_questions, lengths, seed)`
- `files`: `path` with a `{length}` placeholder, one file per entry of `lengths`
- `conditions`: `subsets` maps condition name -> file (controlled sets; all rows share one L)
- `synthetic_controlled`: the controlled sets built in-process on the synthetic world
  (`data_prep.controlled.{position,order,distance}_sets`, chosen by `analysis`)
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from parser.methods.base import Sample


@dataclasses.dataclass
class Subset:
    dataset: str
    length: int  # paragraphs L of the packed documents
    condition: str | None  # controlled analyses only
    condition_index: int | None
    samples: list[Sample]

    @property
    def label(self) -> str:
        return f"{self.dataset} L={self.length}" + (f" {self.condition}" if self.condition else "")


def _read(path: str | Path) -> list[dict[str, Any]]:
    from data_prep.files import read_records

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"eval data file {path} does not exist; build it with `python -m data_prep.build` "
                                f"or point dataset.path at it")
    return read_records(path)


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


def _condition_subsets(name: str, by_condition: dict[str, tuple[list[dict[str, Any]], str]],
                       limit: int | None) -> list[Subset]:
    subsets = []
    for i, (condition, (records, source)) in enumerate(by_condition.items()):
        subsets.append(Subset(name, _length_of(records, source), condition, i, _samples(records, source, limit)))
    seen: dict[tuple[int, str], str] = {}
    for subset in subsets:  # result keys carry no condition, so ids must differ across conditions
        for s in subset.samples:
            other = seen.setdefault((subset.length, s.id), subset.condition)
            if other != subset.condition:
                raise ValueError(f"dataset {name!r}: sample id {s.id!r} appears under conditions {other!r} and "
                                 f"{subset.condition!r}; give each variant its own id")
    return subsets


def load_subsets(cfg: Mapping[str, Any], limit: int | None = None) -> list[Subset]:
    name, source = cfg["name"], cfg.get("source", "files")
    if source == "synthetic":
        from data_prep import build_synthetic_eval

        lengths = [int(x) for x in cfg["lengths"]]
        rows = build_synthetic_eval(num_questions=int(cfg["num_questions"]), lengths=tuple(lengths), seed=int(cfg.get("seed", 0)))
        by_length: dict[int, list[dict[str, Any]]] = {L: [] for L in lengths}
        for row in rows:
            by_length[int(row["length"])].append(row)
        return [Subset(name, L, None, None, _samples(by_length[L], f"synthetic L={L}", limit)) for L in lengths]
    if source == "files":
        subsets = []
        for L in cfg["lengths"]:
            path = str(cfg["path"]).format(length=L)
            subsets.append(Subset(name, int(L), None, None, _samples(_read(path), path, limit)))
        return subsets
    if source == "conditions":
        return _condition_subsets(name, {str(c): (_read(p), str(p)) for c, p in dict(cfg["subsets"]).items()}, limit)
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
        return _condition_subsets(name, {c: (rows, f"synthetic {analysis} {c}") for c, rows in sets.items()}, limit)
    raise ValueError(f"dataset {name!r}: unknown source {source!r} (synthetic | files | conditions)")
