"""Methods that answer a long-context sample: ParSer and the paper's baselines, one folder each.

A method is a folder `parser/methods/<name>/` (its class in `method.py`, exported by its
`__init__.py`; its prompts in `prompts/<version>/`, with `tools.json` if it calls tools), and its
config `configs/method/<name>.yaml` names the class once with a `_target_` path. There is no
registry to edit: `build_method` imports whatever class the config names (docs/adding_a_method.md).

    parser eval method=memagent                       # configs/method/memagent.yaml
    method = build_method(method_config("rag", top_k=5), models)   # the same, from Python
    result = await method.run(sample)

This package imports only downward (base, the engine and its components); nothing below it imports
a method (tests/test_import_graph_on_cpu.py).
"""
from __future__ import annotations

from typing import Any, Mapping

from parser.serving.backends.models import Models
from parser.base.config import compose_preset
from parser.base.instantiate import build, locate
from parser.methods.base import Method, MethodResult, Sample

__all__ = ["Method", "MethodResult", "Sample", "build_method", "method_class", "method_config"]


def method_class(target: str) -> type:
    """The class a `_target_` path (`parser.methods.rag.AgenticRAGMethod`) names."""
    return locate(target, where="method _target_")


def build_method(cfg: Mapping[str, Any], models: Models) -> Method:
    """The method a resolved method config (`cfg.method` of eval.run, or `method_config`) names:
    its `_target_` class, built on `models` with every other key but `name` and `label`."""
    if "_target_" not in cfg:
        raise ValueError(f"method config {cfg.get('name', '?')!r} has no _target_ (configs/method/<name>.yaml "
                         "names its class, e.g. _target_: parser.methods.rag.AgenticRAGMethod)")
    return build(cfg, where=f"method config {cfg.get('name', '?')!r}", models=models)


def method_config(name: str, **overrides: Any) -> dict[str, Any]:
    """`configs/method/<name>.yaml` composed by Hydra (its episode preset, sandbox, embedder...),
    `overrides` merged on top key by key, resolved; for callers outside eval.run (scripts, tests)."""
    from omegaconf import OmegaConf

    cfg = compose_preset("method", name)
    OmegaConf.set_struct(cfg, False)  # overrides may add keys, as `+key=` would on the command line
    if "label" in cfg:
        del cfg["label"]  # a table row name, built by eval's resolvers; not the method's (pop would resolve it)
    return OmegaConf.to_container(OmegaConf.merge(cfg, overrides), resolve=True)
