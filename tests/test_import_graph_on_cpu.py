"""The project's own packages import each other without a cycle and only down the floors of
redesign §3.1 (`FLOORS`), and production never imports tests.

Every `import` / `from ... import` statement in `parser/`, `eval/` and `data_prep/` counts, at any
depth (a function-level import closes a cycle as surely as a top-level one: that is how the old
method registry did). `from pkg import name` counts as importing `pkg.name` when that is a module.

    .venv/bin/pytest tests/test_import_graph_on_cpu.py -q
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("parser", "eval", "data_prep")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            for target in targets:
                while target and target not in modules:  # `import parser.x.y` of a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_checker_sees_a_function_level_cycle(tmp_path):
    graph = {"parser.methods": {"parser.baselines"}, "parser.baselines": {"parser.methods"}, "parser.x": set()}
    assert cycles(graph) == [["parser.baselines", "parser.methods"]]


# Test code is whatever tests/ makes importable (pytest puts tests/ on the path): its modules
# (`verl_fakes`, `scripted_lead`, ...) and packages (`support`: the loopback worker, the CPU runs'
# leads, ...), and `tests` itself. None of it ships (pyproject.toml packages only parser, eval,
# data_prep and configs).
TEST_NAMES = ({"tests"} | {p.stem for p in (ROOT / "tests").glob("*.py")}
              | {p.name for p in (ROOT / "tests").iterdir() if (p / "__init__.py").is_file()})


def _test_references(path: Path) -> list[str]:
    """Test modules that `path` imports, or names as a module string (`python -m support.loopback`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"\w+(\.\w+)+", node.value):
            found.append(node.value)
    return sorted({name for name in found if name.split(".")[0] in TEST_NAMES})


def test_production_never_imports_test_code():
    assert {"support", "verl_fakes", "scripted_lead"} <= TEST_NAMES  # the checker knows where test code lives
    offenders = {name: _test_references(path) for name, path in _modules().items()}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_the_test_code_checker_sees_a_module_string(tmp_path):
    """`parser/serving/gateway.py` once started the loopback worker as `python -m <test module>` by string."""
    path = tmp_path / "gateway.py"
    path.write_text('import sys\nARGV = [sys.executable, "-m", "support.loopback", "--port", "1"]\n')
    assert _test_references(path) == ["support.loopback"]
    path.write_text('"""Start `python -m support.loopback` from a checkout."""\nfrom verl_fakes import ANSWER\n')
    assert _test_references(path) == ["verl_fakes"]  # a docstring may name test code; an import may not


# The floors of docs/design (redesign §3.1): what each package may import of the project. A
# package imports its own floor and the floors listed; anything else is an arrow back up. An
# exception is a change to this table in review, never a constant beside it.
_BELOW_TRAIN = ("parser.base", "parser.text", "parser.records", "parser.serving", "parser.engine")
FLOORS: dict[str, tuple[str, ...]] = {
    "parser.base": (),
    "parser.text": (),
    "parser.offline": (),
    "parser.records": ("parser.base", "parser.text"),
    "parser.serving": ("parser.base", "parser.text", "parser.offline"),
    "parser.engine": ("parser.base", "parser.text", "parser.records", "parser.serving"),
    "parser.train": _BELOW_TRAIN,  # never parser.methods: a method's loop imports the trainer
    "parser.methods": _BELOW_TRAIN,  # and, from a method's train.py only, parser.train
    "parser.plan": _BELOW_TRAIN,
    "data_prep": ("parser.base", "parser.text", "parser.records", "parser.serving", "parser.offline"),
    "eval": ("parser.base", "parser.text", "parser.offline", "parser.records", "parser.serving", "parser.engine",
             "parser.methods", "parser.plan", "data_prep"),
}
# The ways in, which may import anything (the package root, the demo, the one-question command).
ENTRY_POINTS = ("parser", "parser.__main__", "parser.cli.demo", "parser.cli.ask", "parser.cli")


def _floor(module: str) -> str | None:
    """The FLOORS key `module` belongs to (None for an entry point)."""
    if module in ENTRY_POINTS or module.startswith("parser.cli."):
        return None
    found = [f for f in FLOORS if module == f or module.startswith(f + ".")]
    assert found, f"{module} is on no floor: add its package to FLOORS"
    return max(found, key=len)


def _allowed(module: str) -> tuple[str, ...]:
    floor = _floor(module)
    if floor is None:
        return ("parser", "eval", "data_prep")
    extra = ("parser.train",) if floor == "parser.methods" and module.endswith(".train") else ()
    return (floor, *FLOORS[floor], *extra)


def arrows_up(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module's imports that leave its floor and the floors below it."""
    def inside(target: str, floors: tuple[str, ...]) -> bool:
        return any(target == f or target.startswith(f + ".") for f in floors)

    found = {m: sorted(t for t in targets if not inside(t, _allowed(m))) for m, targets in graph.items()}
    return {m: t for m, t in found.items() if t}


def test_layers_only_import_down():
    assert arrows_up(import_graph()) == {}


def test_the_floor_checker_sees_an_arrow_up():
    """The trainer importing a baseline (the old TRAINS_A_BASELINE), a method's component importing
    the trainer, and a method's own train.py importing the trainer (allowed)."""
    graph = {"parser.train.memagent_loop": {"parser.methods.memagent", "parser.serving.types"},
             "parser.methods.memagent.method": {"parser.train.reward"},
             "parser.methods.memagent.train": {"parser.train.reward", "parser.methods.memagent.method"},
             "parser.serving.types": set(), "parser.train.reward": set(), "parser.methods.memagent": set()}
    assert arrows_up(graph) == {"parser.train.memagent_loop": ["parser.methods.memagent"],
                                "parser.methods.memagent.method": ["parser.train.reward"]}


def test_building_a_method_never_loads_the_trainer():
    """Every method package imported in a fresh interpreter loads neither verl nor parser.train:
    eval, the demo and the planner build methods on machines without the trainer's stack."""
    import subprocess
    import sys

    names = sorted(p.parent.name for p in (ROOT / "parser" / "methods").glob("*/__init__.py"))
    assert {"parser", "memagent", "rememr1"} <= set(names)
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module('parser.methods.' + name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'verl' or m.startswith('parser.train')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# Core dependencies that no module of ours imports, and why each is still one.
USED_THROUGH_ANOTHER = {
    "jinja2": "transformers renders every chat template with it but lists it only under an extra",
    "gguf": "transformers loads the demo's GGUF SmolLM2 with it (parser.offline.assets, gguf_file=)",
}


def _external_imports() -> set[str]:
    """Top-level names of the non-project modules that parser/, eval/ and data_prep/ import."""
    names = set()
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
    return names - set(PACKAGES)


def test_every_core_dependency_is_imported_or_says_why():
    """pandas sat in the core dependencies with nothing importing it."""
    import importlib.metadata
    import tomllib

    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    names = [normal(re.match(r"[A-Za-z0-9._-]+", d).group(0)) for d in dependencies]
    by_module = importlib.metadata.packages_distributions()
    imported = {normal(dist) for module in _external_imports() for dist in by_module.get(module, [])}
    unused = [n for n in names if n not in imported and n not in USED_THROUGH_ANOTHER]
    assert unused == [], f"core dependencies nothing imports: {unused}; drop them or say why in USED_THROUGH_ANOTHER"
    assert set(USED_THROUGH_ANOTHER) <= set(names)
