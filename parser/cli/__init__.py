"""`parser`: the one way in. Each subcommand is one row, `name -> ("module:function", help)`.

    parser --help                      # this table; imports nothing but the standard library
    parser demo                        # = python -m parser demo
    parser eval method=memagent data=hotpotqa_eval
    parser data --config-name hotpotqa_eval
    parser train --config-name train/parser_4b parser.gateway_url=http://127.0.0.1:30000

Why a table and not a framework: the rows are the whole interface (torchtune's `tune` does the
same), a module is imported only when its subcommand runs (so `--help` is instant and a CPU
install never imports verl to print it), and each program keeps its own parser — Hydra for the
config-driven ones, argparse for the rest — so `parser eval --help` is eval's own help.
`sys.argv[0]` becomes `parser <name>` before the program reads its arguments. The old ways in
(each module's own `-m` entry point such as `eval.run` or `data_prep.build`, and the
`parser-demo`, `parser-ask` and `parser-serve` scripts) run the same functions.
"""
from __future__ import annotations

import difflib
import importlib
import sys
from typing import Sequence

# name -> (module:function, one line of help). A two-word name is a subcommand of the first word.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("parser.cli.demo:main", "answer questions about the embedded demo document (configs/demo.yaml)"),
    "ask": ("parser.cli.ask:main", "ask your own document a question"),
    "serve": ("parser.serving.server:main", "serve a model over SGLang's and OpenAI's HTTP APIs on this machine"),
    "gateway": ("parser.cli.gateway:main", "start subagent workers behind the cache-aware router (configs/serve/)"),
    "loopback": ("parser.serving.loopback:main", "a model-free worker that answers every wire format (CPU tests, benches)"),
    "eval": ("eval.run:main", "run methods over eval sets, resumable (configs/eval/)"),
    "report": ("eval.report:main", "tables and figures from eval run directories"),
    "view": ("eval.viewer:main", "one HTML page per trajectory of a run"),
    "ruler": ("eval.ruler:main", "the RULER evaluation (configs/eval/ruler.yaml)"),
    "ruler report": ("eval.ruler:main", "RULER's table from its run directory"),
    "order-study": ("eval.order_study:main", "the chunk-order study over the sequential methods"),
    "data": ("data_prep.build:main", "build a dataset from configs/data/<name>.yaml"),
    "data ruler": ("data_prep.ruler:main", "build RULER's tasks (configs/data/ruler.yaml)"),
    "train": ("parser.train.train:main", "train the lead with verl's asynchronous GRPO (configs/train/)"),
    "train smoke": ("parser.cli.train_smoke:main", "the CPU smoke run's tiny lead and parquet (recipes/train_cpu_smoke.sh)"),
    "train warm-start": ("parser.cli.warm_start:main", "the CPU learning run's warm-started lead (recipes/train_cpu_learn.sh)"),
    "train memagent-smoke": ("parser.cli.memagent_smoke:main", "the CPU MemAgent run's tiny lead and parquet (train/memagent_cpu)"),
    "plan": ("parser.plan.__main__:main", "capacity planner: plan | calibrate | validate | table2 (configs/plan/)"),
    "assets": ("parser.offline.assets:main", "fill the offline model cache (SmolLM2, templates, tokenizers)"),
}
# argv kept for the program: `parser ruler report DIR` reaches eval.ruler as `report DIR`
KEEPS_SUBCOMMAND = {"ruler report"}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {help}" for name, (_, help) in COMMANDS.items())
    return ("usage: parser <command> [arguments]   (python -m parser <command> ... is the same)\n\n"
            f"commands:\n{rows}\n\n`parser <command> --help` shows the command's own options.")


def resolve(argv: Sequence[str]) -> tuple[str, list[str]]:
    """(command name, the arguments it gets) for argv without the program name."""
    if len(argv) >= 2 and f"{argv[0]} {argv[1]}" in COMMANDS:
        name = f"{argv[0]} {argv[1]}"
        return name, list(argv[1:] if name in KEEPS_SUBCOMMAND else argv[2:])
    return argv[0], list(argv[1:])


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    name, rest = resolve(argv)
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else "; `parser --help` lists them"
        print(f"parser: unknown command '{name}'{hint}", file=sys.stderr)
        raise SystemExit(2)
    module, function = COMMANDS[name][0].split(":")
    sys.argv = [f"parser {name}", *rest]
    getattr(importlib.import_module(module), function)()
