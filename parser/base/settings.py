"""A composed run config, checked before anything loads: every numeric setting in its domain, and
no key the command line made up.

Why it exists: Hydra refuses `limt=3` without saying what was meant, and takes `+limt=3` (or
`+method.chunk_sise=3`) as a new key that nothing reads, so the run went on with the default;
a value outside its domain reached the code that reads it (`parser.base.domains`). The entry
points that compose a config (eval, the demo, ask) call `check_composed` once on the result, and
the Hydra apps run `precheck` on their argv first, so a refusal is one line and exit 2 before a
model, a dataset or a worker starts:

    cfg = compose_checked(config_dir(), "ask", ["models=tiny_cpu", "+method.chunk_sise=3"])
    # ConfigError: unknown setting method.chunk_sise (did you mean method.chunk_size?); ...
    precheck(config_dir("eval"), "default", sys.argv[1:], prog="eval.run")   # in a Hydra app's main

A `+key=value` (or a `++key=value` whose key was not there) is refused where nothing reads a new key: at the top level of the command's
config, in an `episode` section (`EpisodeConfig`'s fields) and in a section whose `_target_`
takes named arguments only. Elsewhere (a `_target_` passing `**kwargs` on, a free-form section
such as `dataset.options`) it is refused only when it is a near miss of a key that is there.
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from parser.base.config import CONFIGS, ConfigError, EpisodeConfig
from parser.base.domains import domain_of, problems, removal_problem

_NOT_IN_STRUCT = re.compile(r"Could not override '([^']+)'")
_ALREADY_THERE = re.compile(r"Could not append to config\. An item is already at '([^']+)'")
# Hydra flags after which argv is not one plain run of overrides the compose API can repeat
_HYDRA_ONLY = {"-m", "--multirun", "-h", "--help", "--hydra-help", "--info", "-i", "--shell-completion", "-sc",
               "--config-path", "-cp", "--config-dir", "-cd", "--experimental-rerun"}


def _node(cfg: Any, path: list[str]) -> Any:
    for part in path:
        cfg = cfg.get(part) if hasattr(cfg, "get") else None
    return cfg


def _has(cfg: Any, path: list[str]) -> bool:
    """Whether the key at `path` is there (its value may be null)."""
    section = _node(cfg, path[:-1])
    return hasattr(section, "keys") and path[-1] in section


def _accepted(section: Any, path: list[str]) -> tuple[set[str], bool]:
    """(the names a section's reader takes, whether it takes any other name too)."""
    from omegaconf import DictConfig

    if path and path[-1] == "episode":
        return {f.name for f in dataclasses.fields(EpisodeConfig)} | {"turn_rules"}, False
    if not path:
        return set(), False  # the command's own settings: it reads only what its config declares
    target = section.get("_target_") if isinstance(section, DictConfig) else None
    if not isinstance(target, str):
        return set(), True
    from parser.base.instantiate import NOT_ARGUMENTS, locate

    try:
        parameters = inspect.signature(locate(target, where=".".join(path))).parameters.values()
    except (ValueError, TypeError):  # an import failure is the builder's to report, with its own words
        return set(), True
    named = {p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} | set(NOT_ARGUMENTS)
    return named, any(p.kind == p.VAR_KEYWORD for p in parameters)


def _unknown(key: str, candidates: set[str], why: str) -> ConfigError:
    parent, _, name = key.rpartition(".")
    near = difflib.get_close_matches(name, sorted(candidates), n=1)
    hint = f" (did you mean {parent + '.' if parent else ''}{near[0]}?)" if near else ""
    listed = f"; valid keys{' of ' + parent if parent else ''}: {', '.join(sorted(candidates))}" if candidates and not near else ""
    return ConfigError(f"unknown setting {key}{hint}; {why}{listed}")


def _is_group(key: str, config_dir: str | Path | None) -> bool:
    """`+embedder=minilm`: a config group chosen, not a setting (its folder is in a config root)."""
    roots = [Path(config_dir)] if config_dir else []
    return any((root / key.replace(".", "/")).is_dir() for root in [*roots, Path(CONFIGS)])


def check_additions(cfg: Any, overrides: Sequence[str], config_dir: str | Path | None = None) -> None:
    """Refuse each `+key=value` of `overrides` that adds a key nothing reads (module docstring)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([o for o in overrides if o.startswith("+") and not o.startswith("++")])
    for override in parsed:
        key = override.key_or_group
        if "@" in key or override.package is not None or key.startswith("hydra.") or _is_group(key, config_dir):
            continue  # a config group chosen or placed somewhere, or Hydra's own: not a setting
        path = key.split(".")
        section = _node(cfg, path[:-1])
        if not hasattr(section, "keys"):
            continue
        siblings = {str(k) for k in section.keys()} - {path[-1]}
        named, open_ended = _accepted(section, path[:-1])
        if path[-1] in named:
            continue
        candidates = siblings | named
        near = difflib.get_close_matches(path[-1], sorted(candidates), n=1)
        if not open_ended or near:
            raise _unknown(key, candidates, "`+` added a key that nothing reads (drop the `+` to set an existing one)")


def check_composed(cfg: Any, overrides: Sequence[str] = (), config_dir: str | Path | None = None) -> None:
    """The whole composed config, before anything is built from it: no made-up `+` key, and every
    numeric setting inside its domain (`parser.base.domains`). Raises `ConfigError`, naming the key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    check_additions(cfg, overrides, config_dir)
    try:
        tree = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as error:  # `chunk_size=${oops}`: an interpolation that names nothing
        raise ConfigError(" ".join(str(error).split())) from None
    found = problems(tree)
    if found:
        raise ConfigError("; ".join(found))


def compose_checked(config_dir: str | Path, config_name: str, overrides: Sequence[str]) -> Any:
    """Hydra's compose of `config_name` with `overrides`, then `check_composed`. Hydra's refusal of
    an unknown key says what was meant (`limt=3`: did you mean limit?); any other composition
    error is a `ConfigError` in Hydra's words."""
    return _checked(config_dir, config_name, overrides)[0]


def _compose(config_dir: str | Path, config_name: str, overrides: Sequence[str], hydra: bool = False) -> Any:
    """Hydra's compose API, the app's own `GlobalHydra` (if one runs) put back after; `hydra`
    keeps Hydra's own node (`hydra.run.dir`) in the result."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    outer = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            return compose(config_name, overrides=list(overrides), return_hydra_config=hydra)
    finally:
        GlobalHydra.instance().hydra = outer


def _take_run_folder(cfg: Any) -> Any:
    """Hydra's run folder (`hydra.run.dir`, resolved), then the `hydra` node dropped as the
    compose API drops it without `return_hydra_config`: one compose serves the check and the
    folder. A folder that does not resolve is its error, raised only after `check_composed` has
    had the first word on a bad interpolation it shares with the run config (`out_dir=${oops}`)."""
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    try:
        folder = OmegaConf.select(cfg, "hydra.run.dir")
    except OmegaConfBaseException as error:
        folder = error
    if "hydra" in cfg:
        with open_dict(cfg):
            del cfg["hydra"]
    return folder


def _checked(config_dir: str | Path, config_name: str, overrides: Sequence[str]) -> tuple[Any, Any]:
    """`compose_checked`'s config, and the run folder the same compose names (`_take_run_folder`)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    def composed(with_overrides: Sequence[str]) -> Any:
        return _compose(config_dir, config_name, with_overrides)

    removed = [removal_problem(o[1:].split("=", 1)[0]) for o in overrides if o.startswith("~")]
    if any(removed):
        raise ConfigError("; ".join(r for r in removed if r))
    try:
        cfg = _compose(config_dir, config_name, overrides, hydra=True)
    except (HydraException, OmegaConfBaseException) as error:
        there = _ALREADY_THERE.search(str(error))
        if there:  # Hydra's own wording offers `++`, which would mean nothing more here
            key = there.group(1)
            value = next((o.split("=", 1)[1] for o in overrides if o.startswith("+") and o.lstrip("+").split("=", 1)[0] == key), "...")
            raise ConfigError(f"+{key}={value}: {key} is already a setting; set it without the `+` ({key}={value}); "
                              "`+` only adds a key that is not there") from None
        typo = _NOT_IN_STRUCT.search(str(error))
        if typo is None:
            raise ConfigError(" ".join(str(error).split())) from None
        key = typo.group(1)
        rest = [o for o in overrides if o.lstrip("~+").split("=", 1)[0] != key]
        try:
            section = _node(composed(rest), key.split(".")[:-1])
        except (HydraException, OmegaConfBaseException):
            section = None
        siblings = {str(k) for k in section.keys()} if hasattr(section, "keys") else set()
        named, open_ended = _accepted(section, key.split(".")[:-1]) if siblings else (set(), False)
        why = "no such key in the composed config" + (f" (+{key}=... adds one, if its reader takes it)" if open_ended else "")
        raise _unknown(key, siblings | named, why) from None
    folder = _take_run_folder(cfg)
    _check_mappings(overrides, composed)
    plus = [o for o in overrides if o.startswith("+")]
    if plus:  # held to the `+` rule: a `+key=` or `++key=` whose key was not there (Hydra lets `+` set a null one)
        before = composed([o for o in overrides if o not in plus])
        overrides = [*(o for o in overrides if o not in plus),
                     *("+" + o.lstrip("+") for o in plus if not _has(before, o.lstrip("+").split("=", 1)[0].split(".")))]
    check_composed(cfg, overrides, config_dir)
    return cfg, folder


def _check_mappings(overrides: Sequence[str], composed: Any) -> None:
    """A `key={...}` where the config holds a number (`runs={a:1}` reached `int()` deep in eval):
    refused with the setting's domain. A section may share a numeric setting's name (`workers`
    is the demo's count and the gateway's section), so the config before the override decides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    mapped = [(text, o) for text, o in zip(overrides, OverridesParser.create().parse_overrides(list(overrides)), strict=True)
              if isinstance(o.value(), dict) and domain_of(o.key_or_group.rsplit(".", 1)[-1]) is not None]
    if not mapped:
        return
    before = composed([text for text in overrides if text not in {t for t, _ in mapped}])
    for _, override in mapped:
        key = override.key_or_group
        held = _node(before, key.split("."))
        if held is not None and not hasattr(held, "keys"):
            raise ConfigError(f"{key}={override.value()!r}: expected {domain_of(key.rsplit('.', 1)[-1]).describe()}")


def precheck(config_dir: str | Path, default_name: str, argv: Sequence[str], prog: str) -> Any:
    """For a Hydra app's `main`, before Hydra runs it: compose what `argv` asks for and check it;
    a refusal is one line on stderr and exit 2. Returns the composed config, or None for argv the
    compose API cannot repeat (multirun, help, another config path), which is left to Hydra."""
    if any(arg.split("=", 1)[0] in _HYDRA_ONLY for arg in argv):
        return None
    name, overrides, args = default_name, [], list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("--config-name", "-cn") and args:
            name = args.pop(0)
        elif arg.startswith("--config-name="):
            name = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            if arg in ("--cfg", "-c", "--package", "-p") and args:
                args.pop(0)
        else:
            overrides.append(arg)
    try:
        cfg, folder = _checked(config_dir, name, overrides)
        check_run_folder(folder)
    except ConfigError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    return cfg


def check_run_folder(folder: Any) -> None:
    """The folder Hydra will run in (`hydra.run.dir`: eval's `out_dir`, the order study's root)
    can be made: no file in the way, the nearest existing folder writable. Hydra makes it before
    the app runs, so a file there was its FileExistsError traceback. Checked without making it
    (the demo's is named by the second it starts). `folder` is `_take_run_folder`'s."""
    if isinstance(folder, Exception):
        raise folder
    if not folder:
        return
    path = Path(str(folder))
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"{path}: cannot be the run folder: {existing} is a file, not a directory")
    if existing is not None and existing != path and not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{path}: cannot be the run folder: {existing} is not writable")
