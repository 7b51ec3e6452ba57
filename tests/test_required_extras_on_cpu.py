"""`make test` fails, not skips, when a training or gateway extra is missing (tests/required_extras.py).

Each case runs pytest in a subprocess on a small test file that imports its extra the way the
training tests do; `sys.modules[name] = None` stands in for a machine without that extra.

    .venv/bin/pytest tests/test_required_extras_on_cpu.py -q
"""
from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

MODULE_LEVEL = """
import sys
import pytest
sys.modules["verl"] = None  # the train extra is not installed
pytest.importorskip("verl")

def test_trainer():
    pass
"""

IN_A_TEST = """
import sys
import pytest
sys.modules["sglang_router"] = None  # the gateway extra is not installed

def test_gateway():
    pytest.importorskip("sglang_router")

def test_not_an_extra():
    pytest.importorskip("a_module_no_extra_provides")
"""


@pytest.fixture
def inner(pytester, monkeypatch):
    pytester.makeconftest('pytest_plugins = ["required_extras"]\n')
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    return pytester


@pytest.mark.slow  # pytest in a subprocess: ~3.5 CPU-s of start-up
def test_without_the_flag_a_missing_extra_is_skipped(inner, monkeypatch):
    monkeypatch.delenv("PARSER_REQUIRE_EXTRAS", raising=False)
    inner.makepyfile(test_module_level=MODULE_LEVEL, test_in_a_test=IN_A_TEST)
    inner.runpytest_subprocess().assert_outcomes(skipped=3)


@pytest.mark.slow  # pytest in a subprocess: ~3.5 CPU-s of start-up
def test_with_the_flag_a_missing_training_extra_fails_the_collection(inner, monkeypatch):
    monkeypatch.setenv("PARSER_REQUIRE_EXTRAS", "1")
    inner.makepyfile(test_module_level=MODULE_LEVEL)
    result = inner.runpytest_subprocess()
    assert result.ret != 0
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*verl cannot be imported*PARSER_REQUIRE_EXTRAS=1*pip install -e '.[[]train[]]'*"])


@pytest.mark.slow  # pytest in a subprocess: ~3.5 CPU-s of start-up
def test_with_the_flag_a_missing_gateway_extra_fails_its_test_and_other_skips_stay(inner, monkeypatch):
    monkeypatch.setenv("PARSER_REQUIRE_EXTRAS", "1")
    inner.makepyfile(test_in_a_test=IN_A_TEST)
    result = inner.runpytest_subprocess()
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*sglang_router cannot be imported*'.[[]gateway[]]'*"])


def test_make_test_sets_the_flag():
    makefile = (TESTS.parent / "Makefile").read_text()
    recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "PARSER_REQUIRE_EXTRAS=1" in recipe and "-m pytest" in recipe
