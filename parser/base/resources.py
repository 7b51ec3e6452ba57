"""Where the shipped Hydra configs are: the one place that locates `configs/`.

Why a module of its own: `configs/` sits at the top of a checkout (next to `parser/`, `eval/`,
`data_prep/`) and ships in the wheel as the `configs` package's data (pyproject.toml), so an
installed ParSer composes the same presets as a checkout. Entry points ask here instead of
walking up from their own file to a checkout that an installed package does not have; this
file imports nothing from the package, so any module can use it.

    config_dir()                                   # .../configs (a checkout's, or site-packages')
    config_dir("episode") / "cpu.yaml"             # one preset
    config_file("configs/plan/rates/h100.yaml")    # a path as configs and docs write it
"""
from __future__ import annotations

import importlib
from importlib import resources
from pathlib import Path

OWNER = "parser-agents"  # configs/__init__.py says the same


def config_dir(*parts: str) -> Path:
    """The `configs/` tree (or a folder or file inside it) of the imported `configs` package."""
    package = importlib.import_module("configs")
    if getattr(package, "OWNER", None) != OWNER:
        raise ImportError(f"`import configs` found {getattr(package, '__file__', None) or list(package.__path__)}, "
                          "not ParSer's configs: another project's `configs` package is earlier on the path "
                          "(run from another directory, or take that directory off PYTHONPATH)")
    return Path(str(resources.files(package))).joinpath(*parts)


def config_file(path: str | Path) -> Path:
    """A file that a config names relative to the repository root (`configs/plan/rates/x.yaml`):
    the path as given if it exists from the launch directory (or is absolute), else the same
    file in the shipped `configs/` tree. Other relative paths are returned unchanged."""
    path = Path(path)
    if path.is_absolute() or path.exists() or path.parts[:1] != ("configs",):
        return path
    return config_dir(*path.parts[1:])
