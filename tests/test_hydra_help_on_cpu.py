"""`--help` lists every config group an entry point composes, search-path groups included.

Hydra's own help lists only the primary config directory's groups: `python -m eval.run --help`
showed `dataset` alone, not `method`, `backend@models` or `episode` (parser/base/hydra_help.py says why).

    .venv/bin/pytest tests/test_hydra_help_on_cpu.py -q      # the command itself: tests/e2e/test_entry_points_on_cpu.py
"""
from __future__ import annotations

import re
from pathlib import Path

from hydra import compose, initialize_config_dir

from parser.base import hydra_help

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"


def help_of(config_dir: Path, name: str, overrides: list[str] = ()) -> str:  # type: ignore[assignment]
    """The help text Hydra prints for this composition (the template, resolved as `--help` resolves it)."""
    hydra_help.register()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        cfg = compose(config_name=name, overrides=[f"hydra.searchpath=[file://{CONFIGS}]", *overrides],
                      return_hydra_config=True)
    return str(cfg.hydra.help.template)


def groups(text: str) -> dict[str, list[str]]:
    """group -> options, from the help's `group (now choice): a, b, c` lines."""
    return {m.group(1): m.group(2).split(", ") for m in re.finditer(r"^(\S+) \(now \S+\): (.*)$", text, flags=re.M)}


def options(folder: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / folder).glob("*.yaml"))


def test_eval_run_help_lists_method_backend_episode_and_dataset_with_their_options():
    listed = groups(help_of(CONFIGS / "eval", "default"))
    assert listed["method"] == options("method") and listed["backend@models"] == options("backend")
    assert listed["episode@method.episode"] == options("episode") and listed["dataset"] == options("eval/dataset")
    tiny = groups(help_of(CONFIGS / "eval", "tiny_cpu"))
    assert tiny["embedder@models.embedder"] == options("embedder")  # composed by this preset only


def test_ruler_order_study_and_demo_list_their_groups_too():
    assert {"method", "backend@models", "episode@method.episode"} <= groups(help_of(CONFIGS / "eval", "ruler")).keys()
    study = groups(help_of(CONFIGS / "eval", "order_study"))
    assert study["embedder@models.embedder"] == options("embedder") and "method" in study
    demo = groups(help_of(CONFIGS, "demo"))
    assert demo == {"episode": options("episode")}  # not every folder of configs/ (train, plan, data...)
