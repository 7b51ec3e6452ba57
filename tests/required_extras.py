"""A pytest plugin: with PARSER_REQUIRE_EXTRAS=1, a missing training or gateway extra fails the run.

The training, gateway and baseline tests begin with `pytest.importorskip("verl")` (or ray,
sglang_router, ...) so a machine without those extras can still run the rest. On CI the same
skip would turn "the trainer cannot even be imported" into a green run. `make test` (CI's
command) sets the flag; then `pytest.importorskip` of any module in `EXTRAS` fails the test,
or the whole collection when called at module level, naming the extra to install. Other
`importorskip`s (and every skip without the flag) behave as usual. tests/conftest.py loads it.

    PARSER_REQUIRE_EXTRAS=1 .venv/bin/pytest tests/test_verl_configs_on_cpu.py -q
"""
from __future__ import annotations

import importlib
import os
from typing import Any

import pytest

ENV = "PARSER_REQUIRE_EXTRAS"
# top-level module -> the pyproject extra that installs it
EXTRAS = {
    "verl": "train", "ray": "train", "transfer_queue": "train", "tensordict": "train", "wandb": "train",
    "sglang_router": "gateway",
    "xgrammar": "cpu",
    "sklearn": "baselines", "wonderwords": "baselines", "rank_bm25": "baselines",
    "simpy": "plan", "scipy": "plan",
    "rlm": "peers",  # make setup installs rlms --no-deps (PEER_PACKAGES); its openai and python-dotenv come with dev
}


def required() -> bool:
    return os.environ.get(ENV) == "1"


def pytest_configure(config: Any) -> None:
    if not required():
        return
    original = pytest.importorskip

    def importorskip(modname: str, *args: Any, **kwargs: Any) -> Any:
        extra = EXTRAS.get(modname.split(".")[0])
        if extra is not None:
            try:
                importlib.import_module(modname)
            except ImportError as error:
                pytest.fail(f"{modname} cannot be imported ({error}) and {ENV}=1 makes a missing extra an error: "
                            f"install it with pip install -e '.[{extra}]' (make setup does)", pytrace=False)
        return original(modname, *args, **kwargs)

    pytest.importorskip = importorskip
    config.add_cleanup(lambda: setattr(pytest, "importorskip", original))
