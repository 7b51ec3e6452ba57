"""Every training file a recipe or training config reads by default is written by a documented command.

Why: `recipes/train_parser.sh` used to default to `data/train/hotpotqa_val.parquet`, which no command
wrote, and the knowledge filter's server was named only in a config comment. Here the recipes
(`recipes/*.sh`, their shell defaults substituted) and the training configs (composed as
`parser.train` composes them) give the data paths; README, docs/, the recipes and the data
configs' own comments give the `parser data` commands, whose files
`data_prep.recipes.planned_outputs` names without running them (checked against what the recipes
really write, on the offline synthetic world). Nothing is downloaded.

    .venv/bin/pytest tests/test_training_data_on_cpu.py -q
"""
from __future__ import annotations

import copy
import functools
import json
import os
import re
import shlex
import socket
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from data_prep import recipes
from data_prep.build import run as build_data
from data_prep.records import DataError

ROOT = Path(__file__).resolve().parent.parent
DATA_CONFIGS = ROOT / "configs" / "data"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "recipes").glob("*.sh")),
             *sorted(DATA_CONFIGS.glob("*.yaml"))]
# `parser data --config-name ...`, the recipes' `"${PARSER[@]}" data ...`, or the module itself
BUILD = re.compile(r"(?:-m data_prep\.build|(?<![\w-])parser data|PARSER\[@\]}\" data) (--config-name[ =]\S+.*)")
FILES = re.compile(r"data\.(?:train|val)_files=(\"[^\"]+\"|\S+)")
# a recipe that builds its own data with the CPU smoke's builder (`parser train smoke`)
SMOKE_BUILD = re.compile(r"\btrain smoke --out \"?([^\"\s]+)\"?")


def shell_defaults(text: str) -> str:
    """A recipe's text with its variables' defaults (`X=${X:-v}`, `X=v`) substituted, in order."""
    env: dict[str, str] = {}
    for name, value in re.findall(r"^\s*(?:export\s+)?([A-Z_]+)=(\S+)", text, flags=re.M):
        default = re.fullmatch(r"\$\{" + name + r":-(.*)\}", value)
        value = default.group(1) if default else value.strip("\"'")
        if "$(" not in value:
            env[name] = substitute(value, env)
    return substitute(text, env)


def substitute(text: str, env: dict[str, str]) -> str:
    for name in sorted(env, key=len, reverse=True):
        text = text.replace("${" + name + "}", env[name]).replace("$" + name, env[name])
    return text


def documented_builds() -> list[tuple[str, str, list[str]]]:
    """(where, config name, overrides) for every data_prep.build command in the documents."""
    found = []
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        text = shell_defaults(text) if path.suffix == ".sh" else text
        for lineno, line in enumerate(text.splitlines(), 1):
            line = line.lstrip("# ")
            match = BUILD.search(line)
            if not match:
                continue
            words = shlex.split(match.group(1).split("`")[0], comments=True)
            name = words[1] if words[0] == "--config-name" else words[0].split("=", 1)[1]
            overrides = [w for w in words[2 if words[0] == "--config-name" else 1:]
                         if "=" in w and "$" not in w and not w.startswith("-")]
            found.append((f"{path.relative_to(ROOT)}:{lineno}", name, overrides))
    return found


def data_config(name: str, overrides: list[str] = ()) -> dict:  # type: ignore[assignment]
    return copy.deepcopy(_composed(name, tuple(overrides)))


@functools.cache  # several tests compose every documented command
def _composed(name: str, overrides: tuple[str, ...]) -> dict:
    with initialize_config_dir(config_dir=str(DATA_CONFIGS), version_base="1.3"):
        return OmegaConf.to_container(compose(config_name=name, overrides=list(overrides)), resolve=True)


@functools.cache  # two tests read it; each build composes a data config
def produced() -> dict[Path, str]:
    """Every file a documented data command writes -> the command's place."""
    out: dict[Path, str] = {}
    for where, name, overrides in documented_builds():
        cfg = data_config(name, overrides)
        if cfg["_target_"] == "data_prep.recipes.controlled":  # file names carry the source's label (planned_outputs says why)
            continue
        for path in recipes.planned_outputs(cfg):
            out.setdefault(Path(os.path.normpath(path)), f"{where}: --config-name {name} {' '.join(overrides)}")
    return out


def recipe_defaults() -> list[tuple[str, Path]]:
    """(recipe, path) for every data file a recipe passes to the trainer by default, and the
    smoke builder's output directories."""
    found = []
    for path in sorted((ROOT / "recipes").glob("*.sh")):
        text = shell_defaults(path.read_text(encoding="utf-8"))
        for value in FILES.findall(text):
            found.append((path.name, Path(os.path.normpath(value.strip('"')))))
    return found


def smoke_outputs(scratch: Path) -> dict[Path, str]:
    """Files the recipes' own smoke builder writes: `parser train smoke --out DIR` puts its
    parquet files under DIR as `write_data(DIR / "data")` does (run here into `scratch` for the names)."""
    from parser.cli.train_smoke import write_data

    names = [p.relative_to(scratch) for p in write_data(scratch / "data", n_train=1, n_val=1)]
    out: dict[Path, str] = {}
    for path in sorted((ROOT / "recipes").glob("*.sh")):
        for directory in SMOKE_BUILD.findall(shell_defaults(path.read_text(encoding="utf-8"))):
            out.update({Path(os.path.normpath(Path(directory) / name)): f"{path.name}: parser train smoke"
                        for name in names})
    return out


def train_config_defaults() -> list[tuple[str, Path]]:
    """(config, path) for the data files every launchable training config reads when not overridden."""
    pytest.importorskip("verl")
    from parser.train.train import CONFIG_DIR

    found = []
    for path in sorted((CONFIG_DIR / "train").glob("*.yaml")):
        if path.stem in ("parser_base", "agent_loop"):  # a base, and the agent-loop registry
            continue
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            data = compose(config_name=f"train/{path.stem}").data
        for key in ("train_files", "val_files"):
            if not OmegaConf.is_missing(data, key):
                found.append((f"train/{path.stem} data.{key}", Path(os.path.normpath(str(data[key])))))
    return found


def test_every_recipe_default_file_is_written_by_a_documented_command(tmp_path):
    made = {**produced(), **smoke_outputs(tmp_path)}
    defaults = recipe_defaults()
    # every recipe that launches the trainer names its files
    assert {"train_parser.sh", "train_cpu_smoke.sh", "train_cpu_learn.sh"} == {where for where, _ in defaults}
    missing = [f"{where}: {path}" for where, path in defaults if path not in made]
    assert not missing, "default training files no documented command writes:\n  " + "\n  ".join(missing)
    # the paper's run reads the two HotpotQA files README documents
    assert "README.md" in made[Path("data/train/hotpotqa_val.parquet")]
    assert "README.md" in made[Path("data/train/hotpotqa_train.parquet")]


def test_every_training_config_default_file_is_written_by_a_documented_command():
    made = produced()
    defaults = train_config_defaults()
    assert {"train/parser_4b", "train/parser_9b", "train/parser_4b_release", "train/memagent_4b"} <= \
        {where.split()[0] for where, _ in defaults}
    missing = [f"{where}: {path}" for where, path in defaults if path not in made]
    assert not missing, "default training files no documented command writes:\n  " + "\n  ".join(missing)


def test_every_documented_data_command_composes():
    builds = documented_builds()
    assert {"hotpotqa_train", "hotpotqa_val", "memagent_train", "memagent_val", "release_train", "learn_cpu"} <= \
        {name for _, name, _ in builds}
    for where, name, overrides in builds:
        assert data_config(name, overrides)["_target_"], where


def test_planned_outputs_are_what_the_recipes_write(tmp_path):
    """The names the coverage test relies on, against the real writers (synthetic world, offline)."""
    small_world = {"name": "synthetic", "num_questions": 6, "seed": 1, "num_paragraphs": 200, "own_paragraphs": 4}
    cases = {
        "synthetic_train": [f"source={small_world}".replace("'", ""), "keep=4", "length=12", "write_eval_json=true"],
        "synthetic_eval": [f"source={small_world}".replace("'", ""), "num_questions=2", "lengths=[12,20]", "parquet=true"],
        "learn_cpu": ["num_train=4", "num_warmup=4", "num_heldout=2", "heldout_lengths=[20]", "warmup_worlds=[]",
                      "train_world.num_paragraphs=400", "heldout_world.num_paragraphs=300"],
    }
    for name, overrides in cases.items():
        cfg = data_config(name, [f"out_dir={tmp_path / name}", *overrides])
        build_data(cfg)
        written = {p for p in (tmp_path / name).iterdir() if not p.name.endswith((".card.json", ".filter.jsonl"))}
        assert written == set(recipes.planned_outputs(cfg)), name


def test_hotpotqa_val_is_hotpotqa_dev_at_the_training_length_for_the_parser_loop():
    train, val = data_config("hotpotqa_train"), data_config("hotpotqa_val")
    assert val["source"]["split"] == "validation" and train["source"]["split"] == "train"
    assert val["length"] == train["length"] == 200 and val["knowledge_filter"] is None and val["split"] == "val"
    assert data_config("memagent_train")["agent_name"] == data_config("memagent_val")["agent_name"] == "memagent_agent"


def test_the_knowledge_filter_without_its_server_stops_before_reading_the_source_and_says_what_it_needs():
    with socket.socket() as s:  # a port nobody listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = data_config("hotpotqa_train", [f"knowledge_filter.backend.base_url=http://127.0.0.1:{port}",
                                         "source.path=/nonexistent/hotpot.json", "out_dir=/nonexistent"])
    with pytest.raises(DataError) as error:  # a source read first would fail on the missing file instead
        recipes.train_set(**{k: v for k, v in cfg.items() if k != "_target_"})
    message = str(error.value)
    assert f"127.0.0.1:{port}" in message and "Qwen3.5-9B" in message and "knowledge_filter.enabled=false" in message
    # and README says it at the command
    line = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if "--config-name hotpotqa_train" in ln)
    assert "Qwen3.5-9B server" in line


# ---------------------------------------------------------------------------------------------
# Every documented data command, run end to end on local files and the tiny offline model (issue 56)

FIXTURES = ROOT / "tests" / "fixtures" / "data"
LOCAL = {"hotpotqa": FIXTURES / "hotpotqa_distractor_validation.jsonl",  # 6 questions, 24 paragraphs
         "2wiki": FIXTURES / "flashrag_2wikimultihopqa_dev.jsonl"}
# The filter's server stands in as the tiny in-process model (parser.offline); any config's backend
TINY_FILTER = {"_target_": "parser.serving.backends.transformers.TransformersBackend.from_config", "model": "tiny-qwen3.5"}
# Downloads by name (the released files); nothing of theirs runs offline.
DOWNLOADS = {"data_prep.recipes.fetch_released"}


def small(cfg: dict, out_dir: Path) -> dict:
    """A documented command's config at test size, its recipe and every other key as composed:
    a hub source becomes the local fixture of its dataset, sizes shrink, the filter asks the tiny model."""
    cfg = {**cfg, "out_dir": str(out_dir)}
    source = cfg.get("source")
    if isinstance(source, dict) and source.get("name") in LOCAL:
        cfg["source"] = {**source, "path": str(LOCAL[source["name"]])}
    elif isinstance(source, dict):  # the synthetic world
        cfg["source"] = {**source, "num_questions": 4, "num_paragraphs": 200, "own_paragraphs": 4}
    name = source.get("name") if isinstance(source, dict) else None
    length = {"2wiki": 12, "hotpotqa": 20}.get(name, 40)  # fits each file (2Wiki's: 14 paragraphs) and 10% windows
    sizes = {"lengths": [8], "num_questions": 2, "keep": 2, "length": length, "distances": [0, 2], "pad": 1,
             "num_train": 2, "num_warmup": 2, "num_heldout": 1, "heldout_lengths": [8], "warmup_worlds": [],
             "train_world": {"seed": 1, "num_paragraphs": 300, "own_paragraphs": 4},
             "heldout_world": {"seed": 2, "num_paragraphs": 300, "own_paragraphs": 4}}
    cfg.update({k: v for k, v in sizes.items() if k in cfg})
    if cfg.get("knowledge_filter") and cfg["knowledge_filter"].get("enabled", True):
        cfg["knowledge_filter"] = {**cfg["knowledge_filter"], "backend": TINY_FILTER, "samples": 1, "max_questions": 3,
                                   "sampling": {"max_new_tokens": 2}}
    return cfg


def test_every_documented_data_command_runs_end_to_end_on_local_files(tmp_path):
    """Issue 56: `--config-name hotpotqa_eval compat=true select_mode=first knowledge_filter.enabled=true`
    (MemAgent's eval selection) crashed before any model call, and no test ran it. Each documented
    command (its overrides as typed) now builds its files; only the sizes, the source file and the
    filter's model are the test's."""
    ran, filtered = set(), []
    for i, (where, name, overrides) in enumerate(documented_builds()):
        cfg = data_config(name, overrides)
        cfg.pop("hydra", None)
        if cfg["_target_"] in DOWNLOADS:
            continue
        key = (name, tuple(overrides))
        if key in ran:
            continue
        ran.add(key)
        out_dir = tmp_path / str(i)
        written = build_data(small(cfg, out_dir))
        assert written, where
        assert all(Path(p).exists() for p in (written.values() if isinstance(written, dict) else [written])), where
        if cfg.get("knowledge_filter") and cfg["knowledge_filter"].get("enabled", True):
            filtered.append((name, out_dir))
    assert ("hotpotqa_eval", ("compat=true", "select_mode=first", "knowledge_filter.enabled=true")) in ran
    assert {"hotpotqa_eval", "hotpotqa_train", "twowiki_eval", "controlled_order", "learn_cpu"} <= {n for n, _ in ran}
    name, out_dir = next((n, d) for n, d in filtered if n == "hotpotqa_eval")
    log = (out_dir / "eval.filter.jsonl").read_text().splitlines()
    card = json.loads((out_dir / "eval_8.json.card.json").read_text())
    assert len(log) == 3 and card["counts"]["filter_asked"] == 3, "the first max_questions questions were asked"
    assert card["config"]["select_mode"] == "first" and card["config"]["compat"] is True
