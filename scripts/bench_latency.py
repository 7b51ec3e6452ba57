"""CPU latency bench: ParSer vs the sequential-memory baseline (MemAgent), the paper's Table 2 /
Figure 3 at CPU scale.

Both methods run through `eval.run` on the same synthetic-world samples at a few lengths with a
real small instruct model (SmolLM2-135M, shipped offline by a PyPI package), one run,
concurrency 1. ParSer's lead and subagents decode under constraints (`method/parser_cpu.yaml`),
so the lead really scatters and its time includes the subagents' reading. In process, the backend
decodes a round's subagent requests as one batch (`parser.serving.backends.transformers`); `--vllm URL`
runs both methods against a vLLM server instead, same model. Printed per length: amortized seconds per sample (subset wall time / subset
size, as in the paper), mean sequential steps (ParSer: lead turns; MemAgent: chunks + 1), and
the MemAgent/ParSer ratios — all from this one invocation. Each method writes a normal eval run
directory, so `parser report outputs/bench` draws the speedup plot.

    .venv/bin/python scripts/bench_latency.py                         # ~ a few minutes on 2 cores
    .venv/bin/python scripts/bench_latency.py dataset.lengths=[12,48] dataset.num_questions=2
    .venv/bin/python scripts/bench_latency.py --methods parser        # methods with a configs/method/<name>_cpu.yaml
    .venv/bin/python scripts/bench_latency.py --smoke                 # seconds: tiny random models, one length (the suite runs it)
    .venv/bin/python scripts/bench_latency.py --vllm http://127.0.0.1:8000   # SmolLM2 served by vLLM
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from eval.report import latency_table, load, speedups, table_to_markdown
from eval.run import evaluate
from parser.base.resources import config_dir

CONFIGS = config_dir()
# --smoke: the same bench on tiny random-weight models, one short length, no warm-up
SMOKE = ["backend@models=tiny_cpu", "dataset.lengths=[12]", "dataset.num_questions=1", "warmup=0"]


def method_available(name: str) -> bool:
    return (CONFIGS / "method" / f"{name}_cpu.yaml").exists()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of configs/eval/bench_cpu.yaml")
    ap.add_argument("--methods", nargs="+", default=["parser", "memagent"], help="first one is the reference")
    ap.add_argument("--out", default=None, help="run directories go here (replaced); default outputs/bench[_vllm]")
    ap.add_argument("--smoke", action="store_true", help="seconds-long run on tiny models (keeps the bench from rotting)")
    ap.add_argument("--vllm", metavar="URL", help="lead and subagents on this vLLM server (configs/backend/vllm.yaml), "
                                                  "serving the SmolLM2 weights of parser.offline.assets.smollm2_dir")
    args = ap.parse_args()
    vllm = ["backend@models=vllm", *(f"models.{role}.{key}={value}" for role in ("lead", "subagent")
                                     for key, value in (("base_url", args.vllm), ("tokenizer", "smollm2")))] if args.vllm else []
    overrides = [*(SMOKE if args.smoke else []), *vllm, *args.overrides]
    args.out = args.out or ("outputs/bench_vllm" if args.vllm else "outputs/bench")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)  # one invocation = one measurement; never mix with an older run
    methods = [m for m in args.methods if method_available(m)]
    for m in set(args.methods) - set(methods):
        print(f"[bench] method {m!r} has no configs/method/{m}_cpu.yaml; skipped")
    rows = {}
    start = time.perf_counter()
    with initialize_config_dir(config_dir=str(CONFIGS / "eval"), version_base="1.3"):
        for m in methods:
            cfg = compose("bench_cpu", overrides=[f"hydra.searchpath=[file://{CONFIGS}]", f"method={m}_cpu",
                                                  f"out_dir={out / m}", *overrides])
            rows[m] = cfg.report.row
            print(f"[bench] {m}: lengths {list(cfg.dataset.lengths)}, {cfg.dataset.num_questions} samples each")
            status = asyncio.run(evaluate(cfg))
            if status:
                print(f"[bench] {m}: some samples failed; see {out / m}/errors.jsonl")

    results, timings = load([out / m for m in methods])
    latency = latency_table(results, timings)
    header = ["method", "length (paragraphs)", "s/sample", "steps", "samples"]
    print("\n" + table_to_markdown(header, [[e["row"], str(e["length"]), f"{e['amortized_s']:.2f}", f"{e['steps']:.1f}",
                                             str(e["samples"])] for e in latency]))
    ratios = speedups(latency, parser_row=rows[methods[0]]) if methods else []
    if ratios:
        print(table_to_markdown(["baseline", "length", "time ratio (baseline / ParSer)", "steps ratio"],
                                [[s["baseline"], str(s["length"]), f"{s['speedup']:.2f}x", f"{s['steps_ratio']:.2f}x"]
                                 for s in ratios]))
    print(f"[bench] total {time.perf_counter() - start:.0f} s; run directories under {out}/ "
          f"(parser report {out} --out {out}/report)")


if __name__ == "__main__":
    main()
