"""Load a model and its tokenizer by name: a hub name, a local path, or a registered offline name.

Offline names (`tiny-qwen3`, `tiny-qwen3.5`, `smollm2`: `parser.offline.models`) are registered
under the `parser.models` entry-point group in pyproject.toml, so this module finds them by name
without importing them (another package may register its own). Every in-process model of the project is loaded here.

    model, tokenizer = load_model_and_tokenizer("Qwen/Qwen3.5-4B", dtype="bfloat16")
    tokenizer = load_tokenizer("tiny-qwen3.5")

Offline (HF_HUB_OFFLINE=1), a name that is none of these is refused at once with the valid
offline names, never retried against the hub.
"""
from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from parser.base.config import ConfigError

MODEL_ENTRY_POINTS = "parser.models"


def _registered(name: str) -> Any | None:
    """The `LocalModel` an installed package registers under `name`, if any."""
    found = [ep for ep in entry_points(group=MODEL_ENTRY_POINTS) if ep.name == name]
    return found[0].load() if found else None


def offline_names() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=MODEL_ENTRY_POINTS))


def hub_offline() -> bool:
    return any(os.environ.get(flag, "").lower() in ("1", "true", "yes") for flag in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def is_local(name: str) -> bool:
    """A registered offline name or a directory on this machine: loading it asks no hub."""
    return _registered(name) is not None or Path(name).expanduser().is_dir()


def _hub_cached(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(name, file), str) for file in ("config.json", "tokenizer_config.json"))


def require_loadable(name: str, where: str = "model") -> None:
    """Refuse at once, naming the valid offline names, a model that is neither registered, nor a
    local directory, nor in the hub cache while the hub is off (a wrong name used to retry the
    hub 22 times, 97 s, before a bare OSError)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: expected a model name or path, got {name!r}")
    if is_local(name) or not hub_offline() or _hub_cached(name):
        return
    raise ConfigError(f"{where}={name!r} is not a local path, not an offline name ({', '.join(offline_names())}) "
                      "and not in the hub cache, and the hub is off (HF_HUB_OFFLINE=1)")


def _from_hub(loader: Any, name: str, **kwargs: Any) -> Any:
    """`loader.from_pretrained(name)`, its failure said in terms of what to set."""
    try:
        return loader.from_pretrained(name, **kwargs)
    except OSError as err:
        raise ConfigError(f"cannot load {name!r} from a local path or the model hub ({str(err).splitlines()[0]}); "
                          f"offline names: {', '.join(offline_names())}") from err


def load_model_and_tokenizer(name: str, **kwargs: Any) -> tuple[Any, Any]:
    """(model, tokenizer) for a registered offline model or a hub name / path."""
    require_loadable(name)
    local = _registered(name)
    if local is not None:
        return local.load(**kwargs)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = _from_hub(AutoTokenizer, name)
    model = _from_hub(AutoModelForCausalLM, name, dtype=kwargs.pop("dtype", "auto"), **kwargs)
    return model.eval(), tokenizer


def load_tokenizer(name: str, where: str = "tokenizer") -> Any:
    require_loadable(name, where)
    local = _registered(name)
    if local is not None:
        return local.tokenizer()
    from transformers import AutoTokenizer

    return _from_hub(AutoTokenizer, name)


def served_tokenizer_name(configured: str | None, served: tuple[str, ...], where: str) -> str:
    """The tokenizer of a remote role: the configured one, else the served model's name when this
    machine has it (a local path or an offline name: parser.serving.server serves `smollm2`), else that
    name from the hub, unless the hub is off: then the setting to add is named."""
    if configured:
        return configured
    if not served:
        raise ConfigError(f"{where}.tokenizer is not set and the server names no model: set {where}.tokenizer")
    name = served[0]
    if is_local(name) or not hub_offline() or _hub_cached(name):
        return name
    raise ConfigError(f"{where}.tokenizer is not set and the served model {name!r} is not on this machine (the hub "
                      f"is off): set {where}.tokenizer to a local copy of its tokenizer")
