"""Load a model and its tokenizer by name: a hub name, a local path, or a registered offline name.

Offline names (`tiny-qwen3`, `tiny-qwen3.5`, `smollm2`: `parser.offline.models`) are registered
under the `parser.models` entry-point group in pyproject.toml, so this module finds them by name
without importing them (another package may register its own). Every in-process model of the project is loaded here.

    model, tokenizer = load_model_and_tokenizer("Qwen/Qwen3.5-4B", dtype="bfloat16")
    tokenizer = load_tokenizer("tiny-qwen3.5")
"""
from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

MODEL_ENTRY_POINTS = "parser.models"


def _registered(name: str) -> Any | None:
    """The `LocalModel` an installed package registers under `name`, if any."""
    found = [ep for ep in entry_points(group=MODEL_ENTRY_POINTS) if ep.name == name]
    return found[0].load() if found else None


def load_model_and_tokenizer(name: str, **kwargs: Any) -> tuple[Any, Any]:
    """(model, tokenizer) for a registered offline model or a hub name / path."""
    local = _registered(name)
    if local is not None:
        return local.load(**kwargs)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=kwargs.pop("dtype", "auto"), **kwargs)
    return model.eval(), tokenizer


def load_tokenizer(name: str) -> Any:
    local = _registered(name)
    if local is not None:
        return local.tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)
