"""Every shipped eval config composes, names a known method, and resolves its paths.

So no config under configs/eval/ or configs/method/ rots: each primary config (default,
tiny_cpu, bench_cpu) with each dataset and method option is composed through Hydra exactly as
`python -m eval.run` would, and every episode section must be a valid `EpisodeConfig`.

    .venv/bin/pytest tests/test_eval_configs_on_cpu.py -q
"""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from eval.datasets import load_subsets
from parser.base.config import EpisodeConfig
from parser.methods import method_class
from parser.engine.tools import TurnRules

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
EVAL = CONFIGS / "eval"
PRIMARY = sorted(p.stem for p in EVAL.glob("*.yaml") if not p.stem.startswith("ruler"))
DATASETS = sorted(p.stem for p in (EVAL / "dataset").glob("*.yaml"))
METHODS = sorted(p.stem for p in (CONFIGS / "method").glob("*.yaml"))


def _compose(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(EVAL), version_base="1.3"):
        return compose(name, overrides=[f"hydra.searchpath=[file://{CONFIGS}]", *overrides])


@pytest.mark.parametrize("name", PRIMARY)
def test_primary_configs_compose(name):
    cfg = _compose(name)
    container = OmegaConf.to_container(cfg, resolve=True)
    assert {"lead", "subagent"} <= set(container["models"])
    assert container["runs"] >= 1 and container["concurrency"] >= 1
    assert container["out_dir"] and "${" not in container["out_dir"]


@pytest.mark.parametrize("method", METHODS)
def test_method_options_name_registered_methods(method):
    full = OmegaConf.to_container(_compose("default", f"method={method}"), resolve=True)
    cfg = full["method"]
    cls = method_class(cfg["_target_"])  # the one place that names the method's class
    assert isinstance(cls, type) and all(callable(getattr(cls, hook, None)) for hook in ("run", "aclose"))
    assert isinstance(getattr(cls, "reading", None), (str, property))  # what ask and the demo say it reads
    assert cfg["_target_"].startswith(f"parser.methods.{cls.__module__.split('.')[2]}.")  # a method is a folder
    assert full["report"]["row"] == cfg["label"]  # tables label the row by the method, not by a default
    for episode in (cfg.get("episode"), (cfg.get("reader") or {}).get("episode")):
        if episode is not None:  # unknown or misspelled keys fail here; turn rules are the tool set's
            TurnRules.from_section(episode.pop("turn_rules", {}))
            EpisodeConfig(**episode)


def test_labels_say_the_mode():
    labels = {m: _compose("default", f"method={m}").method.label for m in METHODS}
    assert labels["full_context_think"] == "Full-context (think)" and labels["full_context"] == "Full-context (non-think)"
    assert len({labels[m] for m in METHODS if not m.endswith(("_cpu", "_yarn"))}) == len(
        [m for m in METHODS if not m.endswith(("_cpu", "_yarn"))])  # every paper row has its own label


def test_eval_preset_is_the_papers():
    episode = EpisodeConfig(**OmegaConf.to_container(_compose("default").method.episode, resolve=True))
    assert (episode.max_turns, episode.chunk_size, episode.lead_temperature, episode.subagent_temperature) == (12, 4096, 0.0, 0.7)
    assert _compose("default").runs == 3


@pytest.mark.parametrize("dataset", DATASETS)
def test_dataset_options_compose(dataset):
    required = ["dataset.path=data/mine.jsonl"] if dataset == "files" else []  # the preset for your own file
    cfg = OmegaConf.to_container(_compose("default", f"dataset={dataset}", *required).dataset, resolve=True)
    assert cfg["name"] and cfg["source"] in {"synthetic", "files", "conditions", "synthetic_controlled"}
    if cfg["source"] == "files" and cfg["lengths"] is not None:
        assert "{length}" in cfg["path"] and len(cfg["lengths"]) >= 1
    if cfg["source"] == "files" and cfg["lengths"] is None:  # one file, one subset
        assert "{length}" not in cfg["path"]
    if cfg["source"] == "conditions":
        assert len(cfg["subsets"]) >= 2


def test_missing_data_file_names_the_file(tmp_path):
    cfg = {"name": "hotpotqa", "source": "files", "path": str(tmp_path / "eval_{length}.json"), "lengths": [50]}
    with pytest.raises(FileNotFoundError, match="eval_50.json"):
        load_subsets(cfg)


def test_a_misspelled_episode_key_is_refused_before_any_model_loads(monkeypatch):
    """`method.episode.max_turn=3` once ran 86 s of model loading before a TypeError; now it is a
    ConfigError naming the key and its nearest valid spelling, and no model is built."""
    import parser.serving.backends.models as models_module
    from eval.run import build_eval_method
    from parser.base.config import ConfigError

    def no_models(*_args, **_kwargs):
        raise AssertionError("models were built before the config was checked")

    monkeypatch.setattr(models_module, "build_models", no_models)
    cfg = _compose("tiny_cpu", "+method.episode.max_turn=3")
    with pytest.raises(ConfigError, match=r"method\.episode\.max_turn \(did you mean method\.episode\.max_turns\?\)"):
        build_eval_method(cfg)


def _records(n: int, length: int | None = None) -> list[dict]:
    return [{"id": f"q{i}", "question": f"Who wrote letter {i}?", "answers": [f"Ana {i}"],
             "context": f"Letter {i} was written by Ana {i}.", **({"length": length} if length is not None else {})}
            for i in range(n)]


def test_dataset_files_reads_one_file_as_one_subset_named_after_it(tmp_path):
    """`dataset=files dataset.path=mine.jsonl`: one subset, named after the file, its length from
    the rows (0 when they give none); plain-text contexts need no `Document i:` headers."""
    import json

    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _records(3)))
    cfg = OmegaConf.to_container(_compose("tiny_cpu", "dataset=files", f"dataset.path={path}").dataset, resolve=True)
    assert cfg["name"] == "mine"
    (subset,) = load_subsets(cfg)
    assert (subset.dataset, subset.length, len(subset.samples), subset.source) == ("mine", 0, 3, str(path))
    path.write_text("".join(json.dumps(r) + "\n" for r in _records(2, length=50)))
    assert load_subsets(cfg)[0].length == 50
    out_dir = _compose("tiny_cpu", "dataset=files", f"dataset.path={path}").out_dir
    assert "/mine/" in out_dir


def test_lengths_that_cannot_apply_to_a_file_are_refused_not_used_as_labels(tmp_path):
    """`dataset.lengths=[50,100]` with a path naming one file once evaluated the same file twice,
    labelled L=50 and L=100; now it is refused, and a placeholder without lengths too."""
    import json

    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _records(2, length=50)))
    with pytest.raises(ValueError, match=r"needs a \{length\} placeholder in dataset\.path"):
        load_subsets({"name": "mine", "source": "files", "path": str(path), "lengths": [50, 100]})
    with pytest.raises(ValueError, match="set dataset.lengths"):
        load_subsets({"name": "x", "source": "files", "path": str(tmp_path / "eval_{length}.jsonl"), "lengths": None})


def test_a_users_search_path_keeps_parsers_configs_first():
    """A method kept outside the repo: `hydra.searchpath=[file://<dir>]` alone finds both its
    config and ParSer's presets (eval.run puts ParSer's configs first on the path)."""
    from eval.run import CONFIGS, with_search_path

    ours = f"file://{CONFIGS}"
    assert with_search_path(["--config-name", "tiny_cpu", "hydra.searchpath=[file:///mine]", "limit=1"]) == [
        "--config-name", "tiny_cpu", f"hydra.searchpath=[{ours},file:///mine]", "limit=1"]
    assert with_search_path([f"hydra.searchpath=[file:///mine,{ours}]"]) == [f"hydra.searchpath=[{ours},file:///mine]"]
    assert with_search_path(["--config-name", "tiny_cpu", "limit=1"]) == ["--config-name", "tiny_cpu", f"hydra.searchpath=[{ours}]", "limit=1"]


def test_the_peers_grid_gives_each_row_its_label_models_and_folder():
    """Issue 54's comparison rows (configs/eval/peers*.yaml), each cell composed as the study runner
    composes it: RLM on ParSer's models (same compute), RLM as its authors run it (its own two
    servers), InfMem on InfMem-4B; no two cells share a table row or a folder, all under the study root.
    (peers_tiny_cpu, the same grid on the tiny models, composes in test_primary_configs_compose.)"""
    from eval.order_study import _entries, cell_overrides

    grid = "peers"
    cfg = _compose(grid)
    entries = _entries(cfg.study.methods, "methods"), _entries(cfg.study.datasets, "datasets")
    cells = {m["config"]: _compose(grid, *cell_overrides(m, d)) for m in entries[0] for d in entries[1]}
    assert len({(c.report.backbone, c.report.row) for c in cells.values()}) == len(cells) == len(entries[0])
    assert len({c.out_dir for c in cells.values()}) == len(cells)
    assert all(c.out_dir.startswith(f"{cfg.study.root}/") for c in cells.values())
    models = {name: OmegaConf.to_container(c.models, resolve=True) for name, c in cells.items()}
    assert cells["rlm"].report.row == "RLM (same models as ParSer)" and models["rlm"] == models["parser"]  # same compute
    assert models["infmem"]["lead"]["tokenizer"] == "ucmp137538/infmem-4B" and cells["infmem"].report.backbone == "InfMem-4B"
    authors = models["rlm_authors"]
    assert (authors["lead"]["api"], authors["subagent"]["api"], cells["rlm_authors"].report.row) == (
        "completions", "chat", "RLM (authors' setup)")
