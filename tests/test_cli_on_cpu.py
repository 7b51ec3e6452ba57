"""`parser <command>`: one table of subcommands, an instant `--help`, the old ways in unchanged.

    .venv/bin/pytest tests/test_cli_on_cpu.py -q
"""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from parser.cli import COMMANDS, main, resolve


def test_help_lists_every_command_and_imports_nothing_heavy():
    code = ("import sys; from parser.cli import main; main(['--help']); "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'hydra', 'transformers', 'verl', "
            "'eval', 'data_prep', 'omegaconf')); print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.rstrip().endswith("HEAVY []")
    for name in COMMANDS:
        assert f"  {name} " in out


def test_python_dash_m_parser_is_the_same_command():
    out = subprocess.run([sys.executable, "-m", "parser", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("usage: parser <command>")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_row_names_a_function(name):
    module, function = COMMANDS[name][0].split(":")
    assert callable(getattr(importlib.import_module(module), function))


def test_unknown_command_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["evl", "method=memagent"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err == "parser: unknown command 'evl'; did you mean 'eval'?\n"


def test_two_word_commands_and_what_the_program_sees():
    assert resolve(["data", "ruler", "x=1"]) == ("data ruler", ["x=1"])
    assert resolve(["data", "--config-name", "hotpotqa_eval"]) == ("data", ["--config-name", "hotpotqa_eval"])
    assert resolve(["ruler", "report", "runs/r"]) == ("ruler report", ["report", "runs/r"])  # eval.ruler reads `report`


def test_the_command_runs_its_program_with_its_own_argv(monkeypatch, capsys):
    """`parser report --help` is eval.report's own help, under the name `parser report`."""
    with pytest.raises(SystemExit) as stop:
        main(["report", "--help"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith("usage: parser report")
