"""Every command the docs show composes through its own entry point, exactly as typed.

Commands are collected from the code blocks of README.md and docs/*.md (fenced or indented) and
from the comments of configs/**/*.yaml: any `python -m <module>` or `python scripts/<name>.py` of
this project, and `parser <command>` / `python -m parser <command>` rows of `parser.cli`. Hydra entry points run with
`--cfg job` appended (Hydra composes the config, prints it and stops before the job); argparse
entry points run until their arguments are parsed. Nothing is trained, served or evaluated, so
the whole set takes seconds, and a doc line that drifted from its config (a shadowed group, an
unquoted value the shell would split, a key that no longer exists) fails here.

    .venv/bin/pytest tests/test_documented_commands_on_cpu.py -q
"""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from parser.cli import COMMANDS as CLI_COMMANDS
from parser.cli import main as cli_main
from parser.cli import resolve

ROOT = Path(__file__).resolve().parent.parent
_COMMAND = re.compile(r"(?:\.venv/bin/)?python3? +(-m +[\w.]+|scripts/\w+\.py)([^`\n]*)")
# `parser <command> ...` and `python -m parser <command> ...`: the command table's rows (parser.cli)
_CLI = re.compile(r"(?:(?:\.venv/bin/)?python3? +-m +parser +|(?<![\w./\[-])(?:\.venv/bin/)?parser +)(?=(?:%s)\b)([^`\n]*)"
                  % "|".join(sorted({name.split()[0] for name in CLI_COMMANDS}, key=len, reverse=True)))
# Entry points that are Hydra apps (`--cfg job` composes and stops); every other entry point of
# the project parses its arguments with argparse. A new entry point must be listed in one of the two.
HYDRA = {"eval.run", "eval.ruler", "eval.order_study", "data_prep.build", "data_prep.ruler", "parser.cli.demo", "parser.train", "parser.train.train",
         "parser.plan", "parser.cli.gateway"}
ARGPARSE = {"eval.report", "eval.viewer", "eval.ruler report", "parser.cli.ask", "parser.serving.server", "parser.serving.loopback", "parser.offline.assets", "parser.cli.memagent_smoke",
            "parser.cli.train_smoke", "parser.cli.warm_start",
            "scripts/gateway_report.py", "scripts/bench_chunking.py", "scripts/bench_data.py", "scripts/bench_latency.py",
            "scripts/bench_scatter.py", "scripts/compare_small_models.py", "scripts/compare_authors.py"}
OURS = ("eval.", "data_prep.", "parser.", "scripts/")


def _doc_lines() -> list[tuple[str, str]]:
    """(where, text) for every doc line that may hold a command; `\\` continuations joined."""
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    lines: list[tuple[str, str]] = []
    for path in sources:
        fenced = False
        for i, text in enumerate(path.read_text().splitlines(), 1):
            if text.lstrip().startswith("```"):
                fenced = not fenced
            elif fenced or text.startswith("    "):
                lines.append((f"{path.relative_to(ROOT)}:{i}", text))
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        for i, text in enumerate(path.read_text().splitlines(), 1):
            if text.lstrip().startswith("#"):
                lines.append((f"{path.relative_to(ROOT)}:{i}", text.lstrip()[1:]))
    joined: list[tuple[str, str]] = []
    for where, text in lines:
        if joined and joined[-1][1].rstrip().endswith("\\") and joined[-1][0].rsplit(":", 1)[0] == where.rsplit(":", 1)[0]:
            joined[-1] = (joined[-1][0], joined[-1][1].rstrip()[:-1] + " " + text.strip())
        else:
            joined.append((where, text))
    return joined


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(where, entry point, arguments) for each documented command of this project."""
    found = []
    for where, text in _doc_lines():
        for match in _CLI.finditer(text):
            words = shlex.split(re.split(r"\s#|\s\|\s|\s>\s|\s&&\s", match.group(1), maxsplit=1)[0])
            name = resolve(words)[0] if words else ""
            found.append((where, f"parser {name}", words[len(name.split()):]))  # the words as typed
        for match in _COMMAND.finditer(text):
            target = match.group(1).removeprefix("-m").strip()
            if not target.startswith(OURS):
                continue
            rest = re.split(r"\s#|\s\|\s|\s>\s|\s&&\s", match.group(2), maxsplit=1)[0]
            found.append((where, target, shlex.split(rest)))
    return found


class _Parsed(Exception):
    """Raised once an argparse entry point has parsed its arguments: the command is valid."""


def _kind(target: str, args: list[str]) -> str:
    """The entry point a command runs: a `parser <command>` row's module, or the module/script."""
    if target.startswith("parser "):
        module = CLI_COMMANDS[target.removeprefix("parser ")][0].split(":")[0]
        return "parser.plan" if module == "parser.plan.__main__" else f"{module} report" if target == "parser ruler report" else module
    return f"{target} report" if target == "eval.ruler" and args[:1] == ["report"] else target


def _run(target: str, args: list[str]) -> None:
    if target.startswith("parser "):
        old_argv = sys.argv
        try:
            cli_main([*target.split()[1:], *args])
        finally:
            sys.argv = old_argv
        return
    argv0 = target if target.startswith("scripts/") else target.replace(".", "/") + ".py"
    old_argv = sys.argv
    sys.argv = [argv0, *args]
    try:
        if target.startswith("scripts/"):
            runpy.run_path(str(ROOT / target), run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=False)
    finally:
        sys.argv = old_argv


def distinct(commands: list[tuple[str, str, list[str]]]) -> list[tuple[str, str, list[str]]]:
    """One entry per distinct command (what a command composes depends on the command only), its
    `where` naming every doc line that shows it: many docs repeat a command shown elsewhere."""
    wheres: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for where, target, args in commands:
        wheres.setdefault((target, tuple(args)), []).append(where)
    return [(", ".join(places), target, list(args)) for (target, args), places in wheres.items()]


COMMANDS = documented_commands()
DISTINCT = distinct(COMMANDS)


def test_the_docs_document_commands():
    assert len(COMMANDS) >= 30  # the collector itself works: README, docs and configs are full of them
    targets = {t for _, t, _ in COMMANDS}
    assert {"parser eval", "parser data", "parser demo", "parser train"} <= targets


@pytest.mark.parametrize("where,target,args", DISTINCT, ids=[f"{w.split(',')[0]} {t} {' '.join(a)}"[:120] for w, t, a in DISTINCT])
def test_documented_command_composes(where, target, args, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # nothing a command writes lands in the checkout
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    kind = _kind(target, args)
    assert kind in HYDRA | ARGPARSE, f"{where}: {target} is not a known entry point; add it to HYDRA or ARGPARSE"
    out = io.StringIO()
    if kind in HYDRA:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
            _run(target, [*args, "--cfg", "job"])
            raise SystemExit(0)
        assert exit_.value.code in (0, None), f"{where}: `{target} {shlex.join(args)}` failed to compose:\n{out.getvalue()[-2000:]}"
        assert out.getvalue().strip(), f"{where}: `--cfg job` printed no config"
        return

    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, *a, **kw):
        original(self, *a, **kw)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises((_Parsed, SystemExit)) as stop:
        _run(target, args)
    assert stop.type is _Parsed, f"{where}: `{target} {shlex.join(args)}` was refused:\n{err.getvalue()[-2000:]}"
