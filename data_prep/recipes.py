"""The recipes behind ``configs/data/*.yaml``: source -> questions -> packed sets -> files + cards.

Each recipe is a plain function of config values, named by a data config's `_target_` (e.g.
`_target_: data_prep.recipes.eval_grid`), so tests call it directly and `data_prep.build` (Hydra)
only forwards the config. A recipe that can name its files before running declares them with
`@writes(...)` (what `planned_outputs` returns). Outputs land in `out_dir`:

| recipe | writes |
|---|---|
| `eval_grid` | ``eval_{L}.json`` per L (+ ``.card.json``), optionally ``eval_{L}.parquet`` |
| `train_set` | ``{name}.parquet`` (verl), ``{name}.json`` (eval rows, optional), knowledge-filter log |
| `controlled` | ``eval_{dataset}_{L}_{variant}.json`` / ``..._distance_{d}.json`` |
| `fetch_released` | MemAgent's / the authors' released eval files, normalised, by name |
"""
from __future__ import annotations

import asyncio
import functools
import random
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from data_prep import controlled as ctl
from parser.base.instantiate import locate, with_target
from data_prep.files import write_card
from parser.records.jsonl import atomic_path, read_records, write_records
from data_prep.packing import build_grid
from data_prep.records import Corpus, DataError, Question, scorable
from data_prep.sources import load_2wiki, load_hotpotqa, read_2wiki, read_hotpotqa
from data_prep.verl_parquet import AGENT_NAME, write_rl_parquet


# The old `recipe:` of a data config -> its `_target_` (kept for one release).
RECIPE_ALIASES = {"recipe": {name: f"data_prep.recipes.{name}"
                             for name in ("eval_grid", "train_set", "controlled", "fetch_released", "learn_sets")}}

Outputs = Callable[[Mapping[str, Any]], list[Path]]


def writes(outputs: Outputs) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare the files a recipe writes, as a function of its config (see `planned_outputs`)."""
    def declare(recipe: Callable[..., Any]) -> Callable[..., Any]:
        recipe.outputs = outputs  # type: ignore[attr-defined]
        return recipe
    return declare


def _grid_files(cfg: Mapping[str, Any]) -> list[Path]:
    names = [f"eval_{length}.json" for length in cfg["lengths"]]
    if cfg.get("parquet"):
        names += [f"eval_{length}.parquet" for length in cfg["lengths"]]
    return [Path(cfg["out_dir"]) / n for n in names]


def _released_files(cfg: Mapping[str, Any]) -> list[Path]:
    if cfg.get("which") == "train":
        from data_prep.sources import TRAIN_FILE

        return [Path(cfg["out_dir"]) / Path(TRAIN_FILE).name]
    return _grid_files(cfg)


def _train_files(cfg: Mapping[str, Any]) -> list[Path]:
    out, name = Path(cfg["out_dir"]), cfg.get("name", "train")
    return [out / f"{name}.parquet"] + ([out / f"{name}.json"] if cfg.get("write_eval_json") else [])


def _learn_files(cfg: Mapping[str, Any]) -> list[Path]:
    return [Path(cfg["out_dir"]) / n for n in ("train.parquet", "warmup.json", "val.parquet",
                                               *(f"heldout_{length}.json" for length in cfg["heldout_lengths"]))]


def load_source(name: str, split: str | None = None, path: str | None = None, revision: str | None = None,
                compat: bool = False, **synthetic: Any) -> tuple[list[Question], Corpus, dict[str, Any]]:
    """(questions, corpus, provenance) for a source config: hub by name, a local file, or synthetic.
    `compat`: read as the authors' readers do (`data_prep.sources.read_hotpotqa` / `read_2wiki`).
    An empty source, or one whose every record is dropped, is an error (not an empty dataset)."""
    questions, corpus, provenance = _load_source(name, split, path, revision, compat, **synthetic)
    if not questions:
        raise DataError(f"source {provenance}: no usable questions (empty input, or every record was dropped "
                        "because a supporting title is missing from its context)")
    return questions, corpus, provenance


def _load_source(name: str, split: str | None, path: str | None, revision: str | None, compat: bool,
                 **synthetic: Any) -> tuple[list[Question], Corpus, dict[str, Any]]:
    return SOURCES.get(name, _dataset_source)(name, split, path, revision, compat, **synthetic)


def _synthetic_source(name: str, split: str | None, path: str | None, revision: str | None, compat: bool,
                      **world: Any) -> tuple[list[Question], Corpus, dict[str, Any]]:
    from data_prep.synthetic_world import synthetic_source

    questions, corpus = synthetic_source(**world)
    return questions, corpus, {"name": "synthetic", **world}


def _dataset_source(name: str, split: str | None, path: str | None, revision: str | None, compat: bool,
                    **_: Any) -> tuple[list[Question], Corpus, dict[str, Any]]:
    """A local file (read in its dataset's format; any other name: FlashRAG's, as 2Wiki's) or the hub."""
    if path:
        questions, corpus = READERS.get(name, read_2wiki)(_read_rows(path), source=str(path), compat=compat)
        return questions, corpus, {"name": name, "path": str(path)}
    if name not in HUB:
        raise ValueError(f"unknown source {name!r}; known: {', '.join([*HUB, *SOURCES])}")
    load, default_split, label = HUB[name]
    return (*load(split or default_split, revision, compat), {"name": label, "split": split, "revision": revision})


SOURCES = {"synthetic": _synthetic_source}  # a source with its own loader; any other name is a dataset
READERS = {"hotpotqa": read_hotpotqa, "2wiki": read_2wiki}  # a local file's format, by dataset
HUB = {"hotpotqa": (load_hotpotqa, "validation", "hotpotqa/hotpot_qa:distractor"),  # loader, default split, label
       "2wiki": (load_2wiki, "dev", "RUC-NLPIR/FlashRAG_datasets:2wikimultihopqa")}


def _read_rows(path: str) -> list[dict[str, Any]]:
    if str(path).endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return read_records(path)


def select(questions: Sequence[Question], n: int | None, seed: int, mode: str = "random") -> list[Question]:
    """n questions: a seeded sample kept in split order ("random") or the first n ("first")."""
    if n is None or n >= len(questions):
        return list(questions)
    if mode == "first":
        return list(questions[:n])
    if mode != "random":
        raise ValueError(f"select mode must be 'random' or 'first', got {mode!r}")
    picked = sorted(random.Random(seed).sample(range(len(questions)), n))
    return [questions[i] for i in picked]


def _token_counts(rows: list[dict[str, Any]], tokenizer: Any) -> list[int] | None:
    if tokenizer is None:
        return None
    from parser.text.chunking import count_tokens

    return [count_tokens(tokenizer, r["context"]) for r in rows]


def _write_eval(out_dir: Path, name: str, rows: list[dict[str, Any]], *, recipe: str, config: dict[str, Any],
                source: dict[str, Any], tokenizer: Any = None, tokenizer_name: str | None = None,
                parquet: bool = False, data_source: str = "", filter_counts: Mapping[str, Any] | None = None) -> Path:
    if not rows:
        raise DataError(f"{out_dir / name}: nothing to write (num_questions={config.get('num_questions')!r} selected no question)")
    path = write_records(out_dir / f"{name}.json", rows)
    counts = {"rows": len(rows), "questions": len({r["meta"]["question_id"] for r in rows}),
              "paragraphs": sum(r["num_docs"] for r in rows), "chars": sum(len(r["context"]) for r in rows),
              **(filter_counts or {})}
    write_card(path, recipe=recipe, config=config, counts=counts, source=source,
               token_counts=_token_counts(rows, tokenizer), tokenizer=tokenizer_name)
    if parquet:
        pq_path = write_rl_parquet(out_dir / f"{name}.parquet", rows, data_source=data_source, split="test")
        write_card(pq_path, recipe=recipe + " (verl parquet)", config=config, counts=counts, source=source)
    return path


@writes(_grid_files)
def eval_grid(*, source: dict[str, Any], out_dir: str, lengths: Sequence[int], num_questions: int | None = 128,
              seed: int = 0, compat: bool = False, select_mode: str = "random", same_questions: bool = True,
              workers: int = 0, parquet: bool = False, tokenizer: Any = None, tokenizer_name: str | None = None,
              knowledge_filter: dict[str, Any] | None = None) -> dict[int, Path]:
    """The L-grid: the same questions at every L (default) or, as ReMemR1's script does, a fresh
    sample per L (`same_questions=False`). With `knowledge_filter` enabled, the first
    `knowledge_filter.max_questions` questions are asked closed-book and those a model answers are
    dropped before selection: MemAgent's eval selection is `max_questions: 200`, `select_mode:
    first`, `num_questions: 128` (its `filter.py`, `filter2.py` `process("hotpotqa_dev", 128)`)."""
    filtering = bool(knowledge_filter and knowledge_filter.get("enabled", True))
    judge = _filter_backend(knowledge_filter) if filtering else None  # before the source: no server fails in seconds
    questions, corpus, provenance = load_source(**source, compat=compat)
    counts: dict[str, Any] = {}
    if judge is not None:
        counts["source_questions"] = len(questions)
        questions = _apply_filter(questions, Path(out_dir) / "eval.filter.jsonl", knowledge_filter, counts, *judge)
        if not questions:
            raise DataError(f"eval_grid {out_dir}: the knowledge filter dropped all {counts['filter_asked']} questions it asked")
    config = {"lengths": list(lengths), "num_questions": num_questions, "seed": seed, "compat": compat,
              "select_mode": select_mode, "same_questions": same_questions, "knowledge_filter": knowledge_filter}
    out: dict[int, Path] = {}
    dataset = questions[0].dataset if questions else "empty"
    for i, length in enumerate(lengths):
        chosen = select(questions, num_questions, seed if same_questions else seed + 1 + i, select_mode)
        rows = build_grid(chosen, corpus, [length], seed=seed, compat=compat, workers=workers)[length]
        out[length] = _write_eval(Path(out_dir), f"eval_{length}", rows, recipe=f"eval_grid/{dataset}", config=config,
                                  source=provenance, tokenizer=tokenizer, tokenizer_name=tokenizer_name,
                                  parquet=parquet, data_source=dataset, filter_counts=counts)
    return out


@writes(_train_files)
def train_set(*, source: dict[str, Any], out_dir: str, name: str = "train", length: int = 200, keep: int | None = 32768,
              seed: int = 0, compat: bool = False, workers: int = 0, knowledge_filter: dict[str, Any] | None = None,
              write_eval_json: bool = False, split: str = "train", agent_name: str = AGENT_NAME) -> Path:
    """Pack every question at L (200), drop those a model answers without context, keep the first N.
    `split` labels the rows (train, or val for a trainer's validation file); `agent_name` names
    the verl agent loop that reads them (parser_agent, or memagent_agent)."""
    filtering = bool(knowledge_filter and knowledge_filter.get("enabled", True))
    judge = _filter_backend(knowledge_filter) if filtering else None  # before the source: no server fails in seconds
    questions, corpus, provenance = load_source(**source, compat=compat)
    dataset = questions[0].dataset if questions else "empty"
    counts: dict[str, Any] = {"source_questions": len(questions)}
    if compat:  # a gold that normalizes to "" can never be rewarded (MemAgent's filter drops it too: "" is in every reply)
        questions = [q for q in questions if all(scorable(a) for a in q.answers)]
        counts["unscorable_dropped"] = counts["source_questions"] - len(questions)
    if judge is not None:
        questions = _apply_filter(questions, Path(out_dir) / f"{name}.filter.jsonl", knowledge_filter, counts, *judge)
    questions = questions[:keep] if keep else questions
    if not questions:
        raise DataError(f"train_set {name}: the knowledge filter dropped all {counts['source_questions']} questions")
    rows = build_grid(questions, corpus, [length], seed=seed, compat=compat, workers=workers)[length]
    counts.update(rows=len(rows), paragraphs=sum(r["num_docs"] for r in rows))
    config = {"length": length, "keep": keep, "seed": seed, "compat": compat, "knowledge_filter": knowledge_filter,
              "split": split, "agent_name": agent_name}
    path = write_rl_parquet(Path(out_dir) / f"{name}.parquet", rows, data_source=dataset, split=split, agent_name=agent_name)
    write_card(path, recipe=f"train_set/{dataset}", config=config, counts=counts, source=provenance)
    if write_eval_json:
        write_records(Path(out_dir) / f"{name}.json", rows)
    return path


# What the knowledge filter asks (paper App. C.1), said where a missing server is found.
FILTER_SERVER_HINT = (
    "the knowledge filter asks a Qwen3.5-9B server (paper App. C.1: questions it answers without the document are "
    "dropped) at knowledge_filter.backend.base_url. Start one there, e.g. `python -m sglang.launch_server "
    "--model-path Qwen/Qwen3.5-9B --port 30000`, or set knowledge_filter.backend.base_url=http://host:port; "
    "knowledge_filter.enabled=false skips it (a set that is not the paper's)")


def _filter_backend(cfg: dict[str, Any]) -> tuple[Any, Any]:
    """The knowledge filter's model client, its server probed (parser.serving.backends.preflight)."""
    from parser.serving.backends import build_backend
    from parser.serving.backends.preflight import ServerUnavailable

    try:
        return build_backend(dict(cfg["backend"]), where="knowledge_filter.backend")
    except ServerUnavailable as error:
        raise DataError(f"{error}\n  {FILTER_SERVER_HINT}") from None


def _apply_filter(questions: list[Question], log_path: Path, cfg: dict[str, Any], counts: dict[str, Any],
                  backend: Any, tokenizer: Any) -> list[Question]:
    from parser.serving.types import SamplingParams

    from data_prep.knowledge_filter import DEFAULT_SAMPLING, parametric_filter

    sampling = SamplingParams(**{**DEFAULT_SAMPLING.__dict__, **dict(cfg.get("sampling") or {})})
    limit = cfg.get("max_questions")  # the paper processed 41,027 questions to keep 32,768
    pool = questions[:limit] if limit else questions
    asked = [{"id": q.id, "question": q.question, "answers": list(q.answers)} for q in pool]

    async def run() -> dict[str, dict[str, Any]]:
        try:
            return await parametric_filter(asked, backend, tokenizer, log_path=log_path, samples=int(cfg.get("samples", 3)),
                                           sampling=sampling, concurrency=int(cfg.get("concurrency", 64)),
                                           seed=int(cfg.get("seed", 0)), enable_thinking=bool(cfg.get("enable_thinking", False)))
        finally:
            await backend.aclose()

    log = asyncio.run(run())
    kept = [q for q in pool if not log[q.id]["answerable"]]
    counts.update(filter_asked=len(pool), filter_dropped=len(pool) - len(kept), filter_kept=len(kept))
    return kept


def controlled(*, kind: str, source: dict[str, Any], out_dir: str, num_questions: int | None = 512, length: int = 6400,
               seed: int = 0, select_mode: str = "random", starts: Sequence[int] = tuple(range(0, 100, 10)),
               distances: Sequence[int] = (0, 200, 800, 1600, 2400, 3200), pad: int = 1600,
               qtype: str | None = "bridge_comparison") -> dict[str, Path]:
    """Position / order / distance sets (see `data_prep.controlled`), one file per variant."""
    if kind not in CONTROLS:
        raise ValueError(f"kind must be {', '.join(CONTROLS)}; got {kind!r}")
    questions, corpus, provenance = load_source(**source)
    dataset = questions[0].dataset if questions else "empty"
    pick = functools.partial(select, n=num_questions, seed=seed, mode=select_mode)
    sets, names = CONTROLS[kind](questions, corpus, pick, dataset=dataset, length=length, seed=seed, starts=starts,
                                 distances=distances, pad=pad, qtype=qtype)
    if not any(sets.values()):
        raise DataError(f"no {dataset} question qualifies for the {kind} control")
    config = {"kind": kind, "num_questions": num_questions, "length": length, "seed": seed, "starts": list(starts),
              "distances": list(distances), "pad": pad, "qtype": qtype}
    return {k: _write_eval(Path(out_dir), names[k], rows, recipe=f"controlled/{kind}/{dataset}", config=config, source=provenance)
            for k, rows in sets.items()}


def _position(questions: list[Question], corpus: Corpus, pick: Callable[..., list[Question]], *, dataset: str,
              length: int, seed: int, starts: Sequence[int], **_: Any) -> tuple[dict[Any, list], dict[Any, str]]:
    sets = ctl.position_sets(pick(questions), corpus, length=length, seed=seed, starts=starts)
    return sets, {k: f"eval_{dataset}_{length}_position_{k}" for k in sets}


def _order(questions: list[Question], corpus: Corpus, pick: Callable[..., list[Question]], *, dataset: str,
           length: int, seed: int, qtype: str | None, **_: Any) -> tuple[dict[Any, list], dict[Any, str]]:
    eligible = [q for q in questions if (not qtype or q.qtype == qtype) and len(q.gold) >= 2 and q.evidences]
    sets = ctl.order_sets(pick(eligible), corpus, length=length, seed=seed, qtype=qtype)
    return sets, {k: f"eval_{dataset}_{length}_{k}" for k in sets}


def _distance(questions: list[Question], corpus: Corpus, pick: Callable[..., list[Question]], *, dataset: str,
              seed: int, distances: Sequence[int], pad: int, **_: Any) -> tuple[dict[Any, list], dict[Any, str]]:
    sets = ctl.distance_sets(pick([q for q in questions if len(q.gold) == 2]), corpus, distances=distances, pad=pad, seed=seed)
    return sets, {k: f"eval_{dataset}_distance_{k}" for k in sets}


CONTROLS = {"position": _position, "order": _order, "distance": _distance}  # controlled(kind=...): its sets and file names


@writes(_released_files)
def fetch_released(*, out_dir: str, which: str = "memagent", lengths: Sequence[int] = (50, 100, 200, 400, 800, 1600, 3200, 6400),
                   revision: str | None = None) -> dict[int, Path]:
    """Download MemAgent's (`which="memagent"`) or the authors' ("hqa_val" / "2wiki_val") eval files by name,
    or (`which="train"`) the authors' training parquet as it is (train/parser_4b_release reads it)."""
    from data_prep.sources import MEMAGENT_EVAL, PARSER_RELEASE, TRAIN_FILE, load_memagent_eval, load_parser_release

    if which == "train":
        rows = load_parser_release("train", revision=revision)
        with atomic_path(Path(out_dir) / Path(TRAIN_FILE).name) as tmp:
            rows.to_parquet(str(tmp))
        path = Path(out_dir) / Path(TRAIN_FILE).name
        write_card(path, recipe="fetch_released/train", config={}, counts={"rows": len(rows)},
                   source={"name": f"{PARSER_RELEASE}/{TRAIN_FILE}", "revision": revision})
        return {0: path}
    out = {}
    for length in lengths:
        rows = load_memagent_eval(length, revision) if which == "memagent" else load_parser_release(which, length, revision)
        path = write_records(Path(out_dir) / f"eval_{length}.json", rows)
        write_card(path, recipe=f"fetch_released/{which}", config={"length": length}, counts={"rows": len(rows)},
                   source={"name": MEMAGENT_EVAL if which == "memagent" else f"{PARSER_RELEASE}/{which}", "revision": revision})
        out[length] = path
    return out


@writes(_learn_files)
def learn_sets(*, out_dir: str, train_world: dict[str, Any], heldout_world: dict[str, Any], types: Sequence[str],
               num_train: int = 128, num_warmup: int = 512, num_heldout: int = 48, train_length: int = 20,
               heldout_lengths: Sequence[int] = (20, 50), seed: int = 0, lexicon: int | None = None,
               warmup_worlds: Sequence[int] = ()) -> dict[str, Path]:
    """The CPU learning run's data (configs/data/learn_cpu.yaml): RL training questions
    (`train.parquet`) and warm-start questions (`warmup.json`, eval rows with their evidence
    chains) from one synthetic world; held-out questions (`heldout_{L}.json` for eval.run,
    `val.parquet` for verl) from another world, minus any that shares a name with the first.
    `lexicon`: both worlds build their names from the same list of that many words
    (`data_prep.synthetic_world.lexicon_words`): shared words, no shared name. `warmup_worlds`:
    seeds of more worlds (train_world's size) that add `num_warmup` questions each to the warm
    start, so a lead fitted to it meets each name a few times and must copy rather than recall."""
    from data_prep.synthetic_world import synthetic_source

    out = Path(out_dir)
    config = {"train_world": dict(train_world), "heldout_world": dict(heldout_world), "types": list(types),
              "num_train": num_train, "num_warmup": num_warmup, "num_heldout": num_heldout,
              "train_length": train_length, "heldout_lengths": list(heldout_lengths), "seed": seed, "lexicon": lexicon,
              "warmup_worlds": list(warmup_worlds)}
    train_qs, train_corpus = synthetic_source(num_train + num_warmup, types=types, lexicon=lexicon, **train_world)
    known = {_title(p) for p in train_corpus.paragraphs} | {q.question for q in train_qs}
    more = [synthetic_source(num_warmup, types=types, lexicon=lexicon, **{**train_world, "seed": s}) for s in warmup_worlds]
    for qs, corpus in more:
        known |= {_title(p) for p in corpus.paragraphs} | {q.question for q in qs}
    pool, heldout_corpus = synthetic_source(8 * num_heldout, types=types, lexicon=lexicon, **heldout_world)
    # an invented name can come up in both worlds by chance: such a question is not held out
    heldout = [q for q in pool if q.question not in known and not (_names(q) & known)][:num_heldout]
    if len(heldout) < num_heldout:
        raise DataError(f"learn_sets: only {len(heldout)} of {len(pool)} held-out questions share no name with the "
                        f"training world; raise heldout_world.num_paragraphs or pick another seed")
    source = {"name": "synthetic", "train_world": dict(train_world), "heldout_world": dict(heldout_world),
              "lexicon": lexicon}
    written: dict[str, Path] = {}
    rows = build_grid(train_qs, train_corpus, [train_length], seed=seed)[train_length]
    written["train"] = write_rl_parquet(out / "train.parquet", rows[:num_train], data_source="synthetic")
    write_card(written["train"], recipe="learn_sets/train", config=config, counts={"rows": num_train}, source=source)
    warmup = rows[num_train:] + [r for qs, corpus in more for r in build_grid(qs, corpus, [train_length], seed=seed)[train_length]]
    written["warmup"] = _write_eval(out, "warmup", warmup, recipe="learn_sets/warmup", config=config, source=source)
    grid = build_grid(heldout, heldout_corpus, list(heldout_lengths), seed=seed)
    for length in heldout_lengths:
        written[f"heldout_{length}"] = _write_eval(out, f"heldout_{length}", grid[length], recipe="learn_sets/heldout",
                                                   config=config, source=source)
    written["val"] = write_rl_parquet(out / "val.parquet", grid[heldout_lengths[0]], data_source="synthetic", split="val")
    return written


def planned_outputs(cfg: Mapping[str, Any]) -> list[Path]:
    """The files a data config (`configs/data/*.yaml`, composed) writes, named without running it:
    what README's data commands produce, so a test can check that every training recipe's default
    files come from one of them (tests/test_training_data_on_cpu.py, which also checks these names
    against what the recipes really write). `controlled` declares none: its file names carry the
    source's dataset label, known only once the source is read."""
    cfg = with_target(cfg, where="data config", aliases=RECIPE_ALIASES)
    outputs = getattr(locate(cfg.get("_target_"), where="data config"), "outputs", None)
    if outputs is None:
        raise ValueError(f"planned_outputs: {cfg['_target_']} names its files from the source it reads "
                         "(it declares no @writes)")
    return outputs(cfg)


def _title(paragraph: str) -> str:
    return paragraph.split("\n", 1)[0].strip()


def _names(question: Question) -> set[str]:
    """Every entity a question's answer depends on: its gold paragraphs' titles and its chain."""
    names = {_title(question.paragraphs[g]) for g in question.gold} | set(question.answers)
    return names | {str(x) for triple in question.evidences for x in (triple[0], triple[2])}
