"""Adding a method is one folder and one config file: the template, copied out of the repository as a
new package under a new name, runs through `python -m eval.run` on the tiny CPU models.

The copy lives in a temp directory put on PYTHONPATH, its config in a temp Hydra config dir added
with `hydra.searchpath`; nothing in `parser/` or `configs/` is created or edited (their files are compared before and after),
so no registry, prompt table or preset anywhere else had to learn the method's name. The tiny models
are the project's own (configs/backend/tiny_cpu.yaml), so this runs offline; it starts a process, so it is
`slow` (tests/e2e/).

    .venv/bin/pytest tests/e2e/test_method_template_on_cpu.py -q
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "parser" / "methods" / "_template"
PACKAGE, NAME = "throwaway_method", "throwaway"


def _tree_state() -> dict[str, tuple[int, int]]:
    """Every file of the library and the configs (bytecode aside) with its size and mtime."""
    return {str(p.relative_to(ROOT)): (p.stat().st_size, p.stat().st_mtime_ns)
            for folder in ("parser", "configs") for p in (ROOT / folder).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def test_a_copied_template_runs_through_eval_run(tmp_path):
    before = _tree_state()
    packages, conf, out = tmp_path / "packages", tmp_path / "conf", tmp_path / "run"
    shutil.copytree(TEMPLATE, packages / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "method.yaml"))
    config = yaml.safe_load((TEMPLATE / "method.yaml").read_text())  # the template's one config file
    cls = config["_target_"].rsplit(".", 1)[1]
    config.update(name=NAME, _target_=f"{PACKAGE}.{cls}", label="Throwaway")
    (conf / "method").mkdir(parents=True)
    (conf / "method" / f"{NAME}.yaml").write_text(yaml.safe_dump(config))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(packages), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "eval.run", "--config-name", "tiny_cpu", f"method={NAME}",
               f"hydra.searchpath=[file://{conf}]", f"out_dir={out}",  # ParSer's configs stay on the path
               "limit=1", "runs=1", "dataset.lengths=[50]", "dataset.num_questions=1", "progress=false",
               "method.max_new_tokens=8"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["method"] == NAME and rows[0]["row"] == "Throwaway"
    assert rows[0]["steps"] == 1 and rows[0]["lead_output_tokens"] > 0  # the copy's own run(), on the tiny lead
    assert rows[0]["record"]["finish_reason"] in ("stop", "length")
    resolved = json.loads((out / "manifest.json").read_text())["config"]["method"]
    assert resolved["_target_"] == f"{PACKAGE}.{cls}"  # built from the temp package, not from parser/
    assert _tree_state() == before  # no edit outside the folder and its config file
