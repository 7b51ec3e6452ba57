"""Methods that answer a long-context sample: ParSer and the paper's baselines, by name.

`METHODS` is the explicit name -> class table; a method config (`configs/method/<name>.yaml`)
names one with `name:` and passes the rest as keyword arguments:

    method = build_method("parser", models, episode={...})   # or "full_context", "memagent", "coa", "rag", ...
    result = await method.run(sample)
    python -m eval.run method=memagent                        # the same, from a config

This package imports only downward (base, the methods, the engine); nothing below imports it.
"""
from __future__ import annotations

from typing import Any

from parser.backends.models import Models
from parser.methods.base import Method, MethodResult, Sample
from parser.methods.coa import ChainOfAgentsMethod
from parser.methods.dci_agent import DCIAgentMethod
from parser.methods.full_context import FullContextMethod
from parser.methods.longharness import LongHarnessMethod
from parser.methods.memagent import MemAgentMethod, ReMemR1Method
from parser.methods.parser import ParSerMethod
from parser.methods.rag import AgenticRAGMethod

__all__ = ["METHODS", "Method", "MethodResult", "Sample", "build_method"]

METHODS: dict[str, type] = {
    "parser": ParSerMethod,
    "parser_release": ParSerMethod,  # configs/method/parser_release.yaml: episode.protocol=release
    "full_context": FullContextMethod,
    "memagent": MemAgentMethod,
    "rememr1": ReMemR1Method,
    "coa": ChainOfAgentsMethod,
    "rag": AgenticRAGMethod,
    "dci": DCIAgentMethod,
    "longharness": LongHarnessMethod,  # configs/method/longharness*.yaml (acquisition: readers | corpus)
}


def build_method(name: str, models: Models, **kwargs: Any) -> Method:
    """`kwargs` is the method's own config section (e.g. `episode` settings for ParSer)."""
    if name not in METHODS:
        raise KeyError(f"unknown method {name!r}; known: {sorted(METHODS)}")
    return METHODS[name](models=models, **kwargs)
