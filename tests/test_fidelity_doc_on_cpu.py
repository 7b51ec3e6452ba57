"""docs/fidelity.md cannot go stale: every module, function, config key and test it names exists.

    .venv/bin/pytest tests/test_fidelity_doc_on_cpu.py -q

The page used to cite `file:line`, and four of those lines had moved. Now it names things, and this
test resolves each name in the project's columns (project default, presets, checked by): a path
exists, a dotted name imports, a bare name is defined in the project's code, `key: value` is what
the cited YAML says, and each test in the last column is a test function in its file. The
release's own names (its column) are the authors' code and are not checked here.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "fidelity.md"
CODE = [p for package in ("parser", "eval", "data_prep") for p in (ROOT / package).rglob("*.py")]
ROWS = [line for line in DOC.read_text(encoding="utf-8").splitlines() if re.match(r"\| \d+a? \|", line)]
DEFAULT_TESTS = "tests/test_release_protocol_on_cpu.py"


def _cells(row: str) -> list[str]:
    cells = [c.strip() for c in row.strip().strip("|").split(" | ")]
    assert len(cells) == 7, f"docs/fidelity.md: a row without 7 columns: {row[:80]}"
    return cells


def _yaml(name: str) -> Path:
    found = [ROOT / name] if (ROOT / name).is_file() else sorted((ROOT / "configs").rglob(Path(name).name))
    assert found, f"docs/fidelity.md names {name}, which is not in the project"
    return found[0]


def _python(name: str) -> object:
    """`a.b.c` as a module attribute: a module of one of parser's floors (`parser.<floor>.a`) or a
    protocol class first, else a full module path."""
    head, *rest = name.split(".")
    floors = ("", "base.", "text.", "records.", "serving.", "engine.", "train.")
    for base in (*(f"parser.{floor}{head}" for floor in floors), head):
        try:
            value = importlib.import_module(base)
            break
        except ImportError:
            continue
    else:
        value = getattr(importlib.import_module("parser.engine.protocol"), head)
    for part in rest:
        value = getattr(value, part) if hasattr(value, part) else importlib.import_module(f"{value.__name__}.{part}")
    return value


def _defined(name: str) -> bool:
    pattern = re.compile(rf"(?m)^\s*(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]|[\"']{name}[\"']|^{name}\.py$")
    return any(pattern.search(p.read_text(encoding="utf-8")) or p.stem == name for p in CODE)


def _check_token(token: str, cell: str) -> None:
    yamls = re.findall(r"`([\w/.-]+\.yaml)`", cell)
    if re.fullmatch(r"[\w./-]+\.(py|yaml|txt|json|md|jinja)", token) and "/" in token:
        assert (ROOT / token).exists(), f"docs/fidelity.md names {token}, which does not exist"
    elif re.fullmatch(r"[\w-]+\.yaml", token):
        _yaml(token)
    elif re.fullmatch(r"[\w-]+\.(json|txt|jinja)", token):
        assert [p for p in (ROOT / "parser").rglob(token)], f"docs/fidelity.md names {token}, which is not in parser/"
    elif (match := re.fullmatch(r"([\w.]+): (\S+)", token)) and yamls:
        values = OmegaConf.load(_yaml(yamls[0]))
        assert str(OmegaConf.select(values, match.group(1))) == match.group(2), f"{yamls[0]}: {token}"
    elif re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", token):
        try:
            _python(token)
        except (AttributeError, ImportError):  # not code: a key of the YAML the cell cites
            assert yamls and OmegaConf.select(OmegaConf.load(_yaml(yamls[0])), token) is not None, \
                f"docs/fidelity.md names {token}: neither code nor a key of {yamls}"
    elif re.fullmatch(r"[A-Za-z_]\w*", token):
        assert _defined(token), f"docs/fidelity.md names {token!r}, which the project's code does not define"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.split("|")[1].strip())
def test_every_project_name_in_the_row_exists(row):
    cells = _cells(row)
    for cell in cells[4:6]:
        for token in re.findall(r"`([^`]+)`", cell):
            _check_token(token, cell)
    tests = re.findall(r"`(test_\w+)`", cells[6])
    files = re.findall(r"\((tests/[\w/]+\.py)\)", cells[6]) or [DEFAULT_TESTS]
    sources = {f: (ROOT / f).read_text(encoding="utf-8") for f in files + [DEFAULT_TESTS]}
    for test in tests:
        assert any(re.search(rf"(?m)^def {test}\(", s) for s in sources.values()), f"no test {test} in {sorted(sources)}"


def test_every_row_number_is_used_once():
    """Rows are cited by number (code comments, other docs, closing notes): two sections merged
    with the same numbers would make a citation point at two rules."""
    numbers = [row.split("|")[1].strip() for row in ROWS]
    assert sorted(n for n in set(numbers) if numbers.count(n) > 1) == []


def test_no_line_numbers_of_the_projects_files():
    """Line numbers of the paper (`P:364`) are fixed; the project's files move."""
    assert re.findall(r"[\w/.-]+\.(?:py|yaml|md|txt|json):\d+", DOC.read_text(encoding="utf-8")) == []


def test_the_checker_fails_on_a_stale_name():
    cell = "O `parser/engine/gather.py` `gather`, `configs/episode/eval.yaml` `max_turns: 12`"
    _check_token("parser/engine/gather.py", cell)
    for stale in ("parser/gathering.py", "render_observations", "gather.render_release_observation", "max_turns: 9"):
        with pytest.raises((AssertionError, AttributeError, ImportError)):
            _check_token(stale, cell)
