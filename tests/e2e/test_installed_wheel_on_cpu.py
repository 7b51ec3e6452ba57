"""ParSer works installed: a wheel (not `pip install -e`) in a fresh venv, run from an empty directory.

Why: configs/ must ship as package data and be found with importlib.resources
(`parser.base.resources`); a module that located its configs by walking up from its own file to a
checkout worked in every editable test and failed on the first preset once installed. Here
nothing of the checkout is on the path: the wheel is built from a copy of exactly the folders
pyproject.toml ships, installed with `--no-deps` into a new venv that sees the already-installed
dependencies through a `.pth` line naming this interpreter's site-packages (a plain path entry:
that site-packages' own `.pth` files, the editable install's finder among them, are not run),
and every command runs with PYTHONPATH unset from an empty temporary directory.

    .venv/bin/pytest tests/e2e/test_installed_wheel_on_cpu.py -q

The demo and the eval run are the documented commands at their smallest size (one sample of a
12-paragraph document): measured ~15 s CPU each on the 2-core machine, mostly imports.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_FILES = ("pyproject.toml", "README.md", "LICENSE")
COMMAND_TIMEOUT_S = 600  # a deadline, not a target: the demo took 85 s at load ~20 on 2 cores

pytestmark = pytest.mark.timeout(4 * COMMAND_TIMEOUT_S)


def _shipped_packages() -> list[str]:
    """The top-level folders pyproject.toml's package discovery includes (`parser*` -> parser)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return sorted({p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]})


def _dependency_dirs() -> list[str]:
    """This interpreter's site-packages: the dependencies the fresh venv borrows (on CI, `.venv`
    lies inside the checkout, so these are the one allowed path into it)."""
    return list(dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib")))


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin dir, empty working dir, environment) with the wheel installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in _shipped_packages():
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in SHIPPED_FILES:
        shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
          "-w", str(tmp / "dist")], tmp, env)
    wheel, = (tmp / "dist").glob("parser_agents-*.whl")

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    python = venv / "bin" / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env).stdout.strip())
    (purelib / "_parser_test_deps.pth").write_text("".join(f"{path}\n" for path in _dependency_dirs()))
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)], tmp, env)

    work = tmp / "empty"
    work.mkdir()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return venv / "bin", work, env


def test_the_package_comes_from_the_wheel_and_the_checkout_is_not_on_the_path(installed):
    bin_dir, work, env = installed
    probe = ("import json, sys, configs, data_prep, eval, parser, parser.base.resources\n"
             "print(json.dumps({'files': [m.__file__ for m in (configs, data_prep, eval, parser)], 'path': sys.path,\n"
             "                  'configs': str(parser.base.resources.config_dir())}))\n")
    out = json.loads(_run([str(bin_dir / "python"), "-c", probe], work, env).stdout)
    venv = bin_dir.parent
    assert all(Path(f).is_relative_to(venv) for f in out["files"]), out["files"]
    assert Path(out["configs"]).is_relative_to(venv) and (Path(out["configs"]) / "episode" / "cpu.yaml").is_file()
    borrowed = {Path(p).resolve() for p in _dependency_dirs()}
    assert not [p for p in out["path"] if p and Path(p).resolve() not in borrowed and Path(p).resolve().is_relative_to(ROOT)], out["path"]
    refused = subprocess.run([str(bin_dir / "python"), "-c", "import support"], cwd=work, env=env, capture_output=True,
                             timeout=COMMAND_TIMEOUT_S)
    assert refused.returncode != 0  # test code (tests/support/) is not installed


def test_the_demo_runs_installed(installed):
    bin_dir, work, env = installed
    _run([str(bin_dir / "parser-demo"), "models=tiny_cpu", "num_samples=1", "length=12", "output=demo.jsonl"], work, env)
    rows = [json.loads(line) for line in (work / "demo.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["steps"] >= 1, rows  # one sample, read through at least one round


def test_an_eval_run_runs_installed(installed):
    bin_dir, work, env = installed
    out = work / "eval-out"
    _run([str(bin_dir / "python"), "-m", "eval.run", "--config-name", "tiny_cpu", "limit=1", "runs=1",
          "dataset.lengths=[12]", f"out_dir={out}", "progress=false"], work, env)
    assert (out / "manifest.json").is_file()
    assert len((out / "results.jsonl").read_text().splitlines()) == 1  # limit=1 x runs=1 x one length


def test_the_server_help_runs_installed(installed):
    bin_dir, work, env = installed
    assert "--model" in _run([str(bin_dir / "python"), "-m", "parser.serving.server", "--help"], work, env).stdout
