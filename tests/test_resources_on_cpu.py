"""`parser.base.resources` finds the shipped configs wherever the process runs, and refuses a stranger's.

    .venv/bin/pytest tests/test_resources_on_cpu.py -q
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from parser.base.resources import config_dir, config_file


def test_the_configs_are_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (config_dir("episode") / "cpu.yaml").is_file()
    assert config_file("configs/train/agent_loop.yaml") == config_dir("train", "agent_loop.yaml")
    assert config_file("configs/plan/rates").is_dir()
    assert config_file("results/x.yaml") == Path("results/x.yaml")  # not a configs path: unchanged


def test_a_local_copy_wins_for_a_path_the_launch_directory_has(tmp_path, monkeypatch):
    """A user's edited `configs/plan/rates/x.yaml` next to where they launch is the one read."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs" / "plan").mkdir(parents=True)
    (tmp_path / "configs" / "plan" / "mine.yaml").write_text("source: me\n")
    assert config_file("configs/plan/mine.yaml").resolve() == (tmp_path / "configs" / "plan" / "mine.yaml").resolve()


def test_another_projects_configs_package_is_named_not_used(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "configs")
    with pytest.raises(ImportError, match=r"not ParSer's configs.*__init__\.py|__init__\.py.*not ParSer's configs"):
        config_dir()
