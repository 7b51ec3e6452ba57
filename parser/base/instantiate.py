"""One way to build a component from its config section: import its `_target_` and call it.

Why it exists: a class picked by `if kind == "..."` in five builders meant five lists to edit for a
new backend, reader, scorer, data recipe or gateway worker, and five error messages. Now a config
names the class (or its `from_config`) once, as torchtune's `_component_` does, and the builder
passes what only the call site has (a model, a tokenizer) as `deps`:

    backend, tokenizer = build({"_target_": "parser.serving.backends.transformers.TransformersBackend.from_config",
                                "model": "tiny-qwen3.5"}, where="models.lead")
    reader = build({"_target_": "parser.engine.readers.SubagentReader"}, where="method.reader",
                   backend=models.subagent, tokenizer=models.subagent_tokenizer)

An old config that picks by name (`type: http`, `kind: module`, `recipe: eval_grid`) keeps working
for one release: the builder's `aliases` map it to its target, with a FutureWarning that says what
to write instead. This module never imports a component itself (it sits at the bottom floor).
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Mapping

# a section's keys that are about it, not arguments of its target (a method's `name`, a table row's `label`)
NOT_ARGUMENTS = ("_target_", "name", "label")

Aliases = Mapping[str, Mapping[str, str]]  # old key -> {old value -> target}, e.g. {"type": {"http": "..."}}


def with_target(cfg: Mapping[str, Any], *, where: str, aliases: Aliases | None = None,
                default: str | None = None) -> dict[str, Any]:
    """A copy of `cfg` that has its `_target_`: an old alias key (`type:`...) becomes one, with a
    FutureWarning, and wins over a `_target_` beside it (`+method.scorer.type=bm25` on a shipped
    config); a section with neither gets `default` (a reader with no settings is the subagent)."""
    cfg = dict(cfg)
    old = [key for key in (aliases or {}) if key in cfg]
    if old:  # shipped configs have no old key: one here is the user's, over a shipped _target_ if any
        key = old[0]
        value = cfg.pop(key)
        known = aliases[key]
        target = known.get(value) if isinstance(value, str) else None
        if target is None:
            raise ValueError(f"{where}: unknown {key} {value!r} (expected one of {', '.join(known)}, or a _target_)")
        cfg["_target_"] = target
        warnings.warn(f"{where}: `{key}: {value}` is deprecated and goes in the next release; write "
                      f"`_target_: {target}` instead", FutureWarning, stacklevel=3)
    elif "_target_" not in cfg and default is not None:
        cfg["_target_"] = default
    return cfg


def locate(path: Any, *, where: str) -> Any:
    """The object a dotted path names (a class, a function, or `Class.from_config`), or a
    ValueError that names the config section and the path."""
    from hydra.utils import get_object

    if not isinstance(path, str) or not path:
        raise ValueError(f"{where}: _target_ must be a dotted path such as package.module.Class, got {path!r}")
    logger = logging.getLogger("hydra.utils")  # get_object logs each failure before raising: ours says it once
    level, logger.disabled = logger.disabled, True
    try:
        return get_object(path)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(f"{where}: cannot import _target_ {path!r} ({error})") from error
    finally:
        logger.disabled = level


def build(cfg: Mapping[str, Any], *, where: str, aliases: Aliases | None = None, **deps: Any) -> Any:
    """`cfg["_target_"](**other keys, **deps)`: every key but `_target_`, `name` and `label` is an
    argument; `where` (e.g. `models.lead`) names the section in errors; `aliases` map an old
    `type:`-style key to a target (see `with_target`)."""
    cfg = with_target(cfg, where=where, aliases=aliases)
    if "_target_" not in cfg:
        raise ValueError(f"{where}: no _target_ (the dotted path of what builds it, e.g. "
                         "_target_: parser.engine.readers.SubagentReader)")
    target = locate(cfg["_target_"], where=where)
    return target(**{k: v for k, v in cfg.items() if k not in NOT_ARGUMENTS}, **deps)
