"""How long the model-output parsers take on hostile text at 32 KB, 128 KB and 1 MB.

    .venv/bin/python scripts/bench_parsers.py                 # every case, 60 s cap each
    .venv/bin/python scripts/bench_parsers.py --sizes 32768 --cap 10
    .venv/bin/python scripts/bench_parsers.py --smoke         # 4 KB, seconds (the suite runs it)

A model decides what these parsers read, so a reply built to be slow (repeated unclosed tags,
deep brackets, JSON garbage for json-repair) must still parse in time linear in its length.
Each case runs in a child process under `--cap` seconds, so a quadratic parser shows as
"> cap" instead of hanging the run. Each cell also gives the ratio to a baseline measured in the
same run on the same text: one linear scan (`json.loads` attempt + a `str.find` per tag). A linear
parser keeps that ratio flat as the size grows; a quadratic one multiplies it by the size step.
Figures are wall-clock on whatever the machine is doing.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from typing import Callable

from parser.text.actions import parse_lead_output
from parser.engine.gather import parse_reply

CALL_HEAD = "plan</think><tool_call>\n<function=query_agents>\n"


def _fill(unit: str, size: int, head: str = "", tail: str = "") -> str:
    return head + unit * max(1, (size - len(head) - len(tail)) // len(unit)) + tail


CASES: dict[str, tuple[Callable[[str], object], Callable[[int], str]]] = {
    "lead: unclosed <answer>": (parse_lead_output, lambda n: _fill("<answer>x ", n, "plan</think>")),
    "lead: <parameter= without '>'": (parse_lead_output, lambda n: _fill("<parameter=q ", n, CALL_HEAD)),
    "lead: unclosed <parameter=q>": (parse_lead_output, lambda n: _fill("<parameter=query>a ", n, CALL_HEAD)),
    "lead: <function= without '>'": (parse_lead_output, lambda n: _fill("<function=f ", n, "x</think><tool_call>")),
    "lead: nested [ in a call": (parse_lead_output, lambda n: _fill("[", n, "x</think><tool_call>", "</tool_call>")),
    "lead: { then quotes": (parse_lead_output, lambda n: _fill('"', n, 'x</think><tool_call>{"name": "query_agents", "arguments": {{{{', "</tool_call>")),
    "lead: stringified args garbage": (parse_lead_output, lambda n: _fill("{a ", n, 'x</think><tool_call>{"name": "query_agents", "arguments": "', '"}</tool_call>')),
    "reply: nested {": (parse_reply, lambda n: _fill("{", n)),
    "reply: { then quotes": (parse_reply, lambda n: _fill('"', n, "{{{{{{{{")),
    "reply: unclosed fence + spaces": (parse_reply, lambda n: _fill(" ", n, "```json", "{")),
    "reply: answer + nested evidence": (parse_reply, lambda n: _fill("[", n, '{"answer": "Paris", "evidence": ')),
    "reply: many small objects": (parse_reply, lambda n: _fill('{"a": [1, "b\': {', n)),
}


def _run(name: str, size: int, queue: multiprocessing.Queue) -> None:
    parse, build = CASES[name]
    text = build(size)
    started = time.perf_counter()
    try:
        parse(text)
        outcome = "ok"
    except BaseException as error:  # noqa: BLE001 - the bench reports what a parser raised
        outcome = type(error).__name__
    queue.put((time.perf_counter() - started, outcome))


def baseline_s(text: str) -> float:
    """One linear pass over `text`: what any parser must at least spend reading it."""
    started = time.perf_counter()
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        pass
    for tag in ("<answer>", "<tool_call>", "<function=", "<parameter=", "{", "```"):
        text.find(tag)
    return max(time.perf_counter() - started, 1e-6)


def measure(name: str, size: int, cap_s: float) -> str:
    queue: multiprocessing.Queue = multiprocessing.Queue()
    child = multiprocessing.Process(target=_run, args=(name, size, queue))
    child.start()
    child.join(cap_s)
    if child.is_alive():
        child.kill()
        child.join()
        return f"> {cap_s:.0f} s"
    seconds, outcome = queue.get()
    ratio = seconds / baseline_s(CASES[name][1](size))
    return f"{seconds:.3f} s (ratio {ratio:,.0f})" + ("" if outcome == "ok" else f" {outcome}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[32 * 1024, 128 * 1024, 1024 * 1024])
    ap.add_argument("--cap", type=float, default=60.0, help="seconds before a case counts as hung")
    ap.add_argument("--only", default="", help="run cases whose name contains this")
    ap.add_argument("--smoke", action="store_true", help="4 KB only, 10 s cap: seconds (the suite runs it)")
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.cap = [4096], 10.0
    print("| case | " + " | ".join(f"{s // 1024} KB" for s in args.sizes) + " |")
    print("|---|" + "---|" * len(args.sizes))
    for name in CASES:
        if args.only in name:
            print(f"| {name} | " + " | ".join(measure(name, s, args.cap) for s in args.sizes) + " |", flush=True)


if __name__ == "__main__":
    main()
