"""`--help` that lists every config group an entry point composes, with its options.

Why: Hydra's `--help` lists only the groups of the primary config directory, so `python -m
eval.run --help` showed `dataset` and not `method`, `backend@models`, `episode` or `embedder`,
which come through the search path (`hydra.searchpath=[configs/]`). Each entry point's config sets
`hydra.help.template: ${hydra_help:${hydra.runtime.choices},${hydra.runtime.config_sources}}`; the
resolver lists each group the run composed (its current choice first) with the options found in
every file source of the run, then the config, as Hydra's own help does.

    parser eval --help
    parser demo --help
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

TEMPLATE_TAIL = "\n== Config ==\nOverride anything in the config (foo.bar=value)\n\n$CONFIG\n"


def group_options(group: str, sources: Any) -> list[str]:
    """Option names of `group` (`backend`, `episode`, ...) in every `file://` config source."""
    names: set[str] = set()
    for source in sources:
        if source["schema"] == "file":
            folder = Path(source["path"]) / group
            names |= {p.stem for p in folder.glob("*.yaml")} if folder.is_dir() else set()
    return sorted(names)


def help_text(choices: Any, sources: Any) -> str:
    lines = ["== Configuration groups ==",
             "Compose your configuration from those groups (group=option; a group@package sets that section)", ""]
    for name, choice in sorted(choices.items()):
        if name.startswith("hydra/") or choice is None:
            continue
        options = group_options(name.split("@", 1)[0], sources)
        if options:
            lines.append(f"{name} (now {choice}): {', '.join(options)}")
    return "\n".join(lines) + "\n" + TEMPLATE_TAIL


def register() -> None:
    """Make `${hydra_help:...}` available (idempotent); call before `@hydra.main` runs."""
    if not OmegaConf.has_resolver("hydra_help"):
        OmegaConf.register_new_resolver("hydra_help", help_text)
