"""Every shipped config loads, and the paper's settings are named once.

Run: .venv/bin/pytest tests/test_configs_on_cpu.py -q
(verl's trainer configs are composed against verl's schema in tests/test_verl_configs_on_cpu.py.)
"""
import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from parser.base.config import EpisodeConfig
from parser.serving.backends import TYPE_ALIASES

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.rglob("*.yaml")), ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_yaml_parses(path):
    assert OmegaConf.load(path) is not None


def test_train_episode_yaml_is_the_dataclass_defaults():
    """Table 9 lives in configs/episode/train.yaml; EpisodeConfig's defaults must say the same."""
    yaml = OmegaConf.to_container(OmegaConf.load(CONFIGS / "episode" / "train.yaml"))
    assert yaml == dataclasses.asdict(EpisodeConfig())


def test_sandbox_yaml_is_the_dataclass_defaults():
    """The DCI sandbox's bounds live in configs/sandbox/default.yaml and in SandboxLimits."""
    from parser.engine.sandbox.tools import SandboxLimits

    yaml = OmegaConf.to_container(OmegaConf.load(CONFIGS / "sandbox" / "default.yaml"))
    assert yaml == dataclasses.asdict(SandboxLimits())


def test_eval_episode_is_train_plus_inference_changes():
    with initialize_config_dir(str(CONFIGS / "episode"), version_base=None):
        cfg = OmegaConf.to_container(compose("eval"))
    config = EpisodeConfig(**cfg)
    assert (config.max_turns, config.chunk_size, config.lead_temperature) == (12, 4096, 0.0)
    assert (config.subagent_temperature, config.subagent_max_tokens, config.max_tokens_per_turn) == (0.7, 512, 2048)


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONFIGS / "backend").glob("*.yaml")))
def test_backend_presets_name_known_targets(preset):
    cfg = OmegaConf.to_container(OmegaConf.load(CONFIGS / "backend" / f"{preset}.yaml"))
    known = set(TYPE_ALIASES["type"].values())
    assert cfg["lead"]["_target_"] in known
    sub = cfg.get("subagent", {})
    assert sub.get("same_as") == "lead" or sub.get("_target_") in known


def test_demo_config_composes():
    with initialize_config_dir(str(CONFIGS), version_base=None):
        cfg = compose("demo", overrides=["models=tiny_cpu"])
    EpisodeConfig(**OmegaConf.to_container(cfg.episode))
    assert cfg.models == "tiny_cpu" and (CONFIGS / "backend" / "tiny_cpu.yaml").exists()


def test_learn_evals_are_the_training_episode_with_the_paper_greedy_lead_or_the_training_temperature():
    """Table 7 in miniature (eval/learn_cpu) evaluates the trained lead as the paper does (greedy,
    configs/episode/eval.yaml) on the episodes it was trained on; eval/learn_cpu_sampled differs
    from it only in sampling the lead at the training temperature (configs/episode/learn_cpu.yaml)."""
    with initialize_config_dir(str(CONFIGS / "episode"), version_base=None):
        training = OmegaConf.to_container(compose("learn_cpu"))
        paper_eval = OmegaConf.to_container(compose("eval"))
    evals = {}
    with initialize_config_dir(str(CONFIGS / "eval"), version_base=None):
        for name in ("learn_cpu", "learn_cpu_sampled"):
            evals[name] = compose(name, overrides=[f"hydra.searchpath=[file://{CONFIGS}]"])
    greedy, sampled = (OmegaConf.to_container(evals[n].method.episode, resolve=True) for n in evals)
    assert greedy == {**training, "lead_temperature": paper_eval["lead_temperature"]} and greedy["lead_temperature"] == 0.0
    assert sampled == training and f"T={training['lead_temperature']}" in evals["learn_cpu_sampled"].report.row
    assert (evals["learn_cpu"].runs, evals["learn_cpu_sampled"].runs) == (1, 2)
