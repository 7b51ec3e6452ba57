"""tests/e2e/: tests that start processes (model servers, the router binary, eval runs killed and
resumed, the benchmarks' --smoke sizes). All of them are `slow`: `make test-fast` skips them,
`make test` (CI) runs them."""
from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.slow)
