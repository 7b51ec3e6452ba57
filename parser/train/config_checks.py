"""Checks a composed training config before any GPU or Ray actor starts.

Why it exists: verl asserts most of these deep inside a Ray actor, minutes into start-up (or,
for the ParSer-specific ones, never). Each failure here names the config keys and what to
set. `parser.train` runs `check_train_config` first; the config test runs it on every
shipped config. What one agent loop needs of the `parser:` block is that loop's own
`check_config` (`agent_loop_problems`), and InfoMem's is `parser.train.infomem.checks`'s.
It includes the schema check: a key that verl's own composed config (for the
run's `model_engine`) does not have is a typo or a removed key, which Hydra merges in silently
from a YAML file (the user's own config included) and verl then ignores.

    parser train --config-name train/parser_4b data.train_batch_size=256   # -> rejected
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from parser.base.resources import config_file
from parser.train.infomem.checks import info_gain_problems


# The two loss aggregations a ParSer run may use: the paper's objective (Eq. 1, 1/|y_i| per
# trajectory) and verl's default, which the authors' released run script keeps (per-token mean
# over the mini-batch); configs/train/parser_4b_release.yaml uses the latter.
PAPER_LOSS_AGG = "seq-mean-token-mean"
RELEASE_LOSS_AGG = "token-mean"


class TrainConfigError(ValueError):
    """A training config that would fail (or silently misbehave) once launched."""


def check_train_config(config: Any) -> None:
    """Raise `TrainConfigError` listing every problem found in a composed trainer config."""
    problems: list[str] = []
    engine = config.get("model_engine")
    unknown = unknown_keys(config, engine) if engine else []
    if unknown:
        problems.append(f"key(s) not in verl's schema (model_engine={engine}): {', '.join(unknown)}; a typo or a "
                        "removed key, which verl would ignore. Free-form sections: " + ", ".join(FREE_FORM))
    v1 = config.trainer.v1
    actor = config.actor_rollout_ref.actor
    rollout = config.actor_rollout_ref.rollout

    if not config.trainer.use_v1 or v1.trainer_mode != "separate_async":
        problems.append("trainer.use_v1=true and trainer.v1.trainer_mode=separate_async are required (fully async)")
    sync_step = int(v1.separate_async.parameter_sync_step)
    mini = int(actor.ppo_mini_batch_size)
    batch = int(config.data.train_batch_size)
    if batch != sync_step * mini:
        problems.append(
            f"data.train_batch_size={batch} must equal trainer.v1.separate_async.parameter_sync_step ({sync_step}) x "
            f"actor_rollout_ref.actor.ppo_mini_batch_size ({mini}) = {sync_step * mini}: one training step is "
            f"parameter_sync_step mini-batch updates followed by a weight sync. Set data.train_batch_size={sync_step * mini}."
        )
    if int(rollout.nnodes) <= 0 or int(rollout.n_gpus_per_node) <= 0:
        problems.append("actor_rollout_ref.rollout.nnodes and n_gpus_per_node must be > 0 (the standalone rollout pool)")
    if rollout.checkpoint_engine.backend == "naive":
        problems.append("actor_rollout_ref.rollout.checkpoint_engine.backend=naive cannot sync weights to a separate "
                        "rollout pool; use nccl")
    if "grad_offload" in (actor.get("megatron") or {}):
        problems.append("actor_rollout_ref.actor.megatron.grad_offload does not exist in verl 0.9.1 "
                        "(param_offload also frees gradient buffers); remove it")
    if actor.loss_agg_mode not in (PAPER_LOSS_AGG, RELEASE_LOSS_AGG):
        problems.append(f"actor_rollout_ref.actor.loss_agg_mode={actor.loss_agg_mode}: use {PAPER_LOSS_AGG} (the paper's "
                        f"objective, Eq. 1: 1/|y_i| per trajectory) or {RELEASE_LOSS_AGG} (verl's default, what the "
                        "authors' released run script trains with)")
    if not rollout.calculate_log_probs:
        problems.append("actor_rollout_ref.rollout.calculate_log_probs=false: the rollout-vs-actor gap cannot be logged")
    if int(rollout.response_length) + int(rollout.prompt_length) > int(actor.ppo_max_token_len_per_gpu) and actor.use_dynamic_bsz:
        problems.append(
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={actor.ppo_max_token_len_per_gpu} < prompt_length + "
            f"response_length = {int(rollout.prompt_length) + int(rollout.response_length)}: one trajectory cannot fit"
        )
    if not rollout.agent.agent_loop_config_path:
        problems.append("actor_rollout_ref.rollout.agent.agent_loop_config_path is not set (configs/train/agent_loop.yaml)")
    if config.get("parser") is None:
        problems.append("no `parser:` block (compose from configs/train/parser_base.yaml)")
    else:
        problems += agent_loop_problems(config)
        problems += info_gain_problems(config.parser.get("info_gain"), rollout)
    if problems:
        raise TrainConfigError("training config rejected:\n  - " + "\n  - ".join(problems))


def agent_loop_problems(config: Any) -> list[str]:
    """The selected agent loop's own checks of its `parser:` settings: the row of the agent-loop
    file that `actor_rollout_ref.rollout.agent.default_agent_loop` names (the loop of every dataset
    row without an `agent_name`), whose class answers `check_config(config)` with a list of problems.
    The trainer knows no loop by name: a method's loop says what it needs."""
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    agent = config.actor_rollout_ref.rollout.agent
    if not agent.agent_loop_config_path:
        return []  # reported by check_train_config
    path = config_file(str(agent.agent_loop_config_path))
    if not path.is_file():
        return [f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent.agent_loop_config_path}: not found"]
    rows = {str(row.name): row for row in OmegaConf.load(path)}
    if agent.default_agent_loop not in rows:
        return [f"actor_rollout_ref.rollout.agent.default_agent_loop={agent.default_agent_loop} is not a row of {path} "
                f"({', '.join(rows)}): name the loop this config trains"]
    return list(get_class(rows[agent.default_agent_loop]._target_).check_config(config))


# Subtrees whose keys verl passes through without a schema (free-form by design), and ParSer's own.
FREE_FORM = (
    "parser",
    "hydra",
    "ray_kwargs.ray_init",
    "actor_rollout_ref.model.override_config",
    "actor_rollout_ref.rollout.engine_kwargs",
    "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs",
    "trainer.v1.sampler.sampler_kwargs",
    # FSDPEngineConfig.mixed_precision: a dict field of verl's dataclass that its YAML omits
    "actor_rollout_ref.actor.fsdp_config.mixed_precision",
    "actor_rollout_ref.ref.fsdp_config.mixed_precision",
)


def _leaf_paths(node: Any, prefix: str = "") -> set[str]:
    """Dotted paths of every leaf (values unresolved; an empty mapping counts as a leaf)."""
    from omegaconf import DictConfig

    if not isinstance(node, (DictConfig, dict)) or not node:
        return {prefix}
    paths: set[str] = set()
    for key in node.keys():
        child = node._get_node(key) if isinstance(node, DictConfig) else node[key]
        paths |= _leaf_paths(child, f"{prefix}.{key}" if prefix else str(key))
    return paths


def verl_schema(model_engine: str) -> Any:
    """verl's own `ppo_trainer` config composed for one model engine: the keys a run may set.

    Composed from verl's config folder alone. Inside a running Hydra app (`parser.train`,
    or a test's `initialize_config_dir`) that app's state is set aside for the compose and put back."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    outer = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
            return compose(config_name="ppo_trainer", overrides=[f"model_engine={model_engine}"])
    finally:
        GlobalHydra.instance().hydra = outer


@functools.lru_cache(maxsize=None)
def _schema_paths(model_engine: str) -> tuple[frozenset[str], frozenset[str], tuple[str, ...]]:
    """What `unknown_keys` reads of verl's schema for one engine: its leaf paths, every prefix of
    them, and the interpolated subtrees. Composed once per process: the schema is the installed
    verl's, and composing it costs ~0.4 CPU-s (a process checking many configs, the test suite,
    composed it dozens of times)."""
    reference = verl_schema(model_engine)
    known = _leaf_paths(reference)
    prefixes = {p.rsplit(".", i)[0] for p in known for i in range(p.count(".") + 1)}
    return frozenset(known), frozenset(prefixes), tuple(sorted(p + "." for p in _interpolated_paths(reference)))


def unknown_keys(config: Any, model_engine: str, free_form: tuple[str, ...] = FREE_FORM) -> list[str]:
    """Key paths in `config` that verl's own composed config for `model_engine` (`verl_schema`)
    does not have: typos and removed keys, which Hydra merges in silently.

    `config` may be resolved (the launch check runs after `OmegaConf.resolve`): a subtree that the
    reference defines by interpolation (`ref.megatron: ${actor.megatron}`) is then a copy, whose
    keys are checked where the interpolation points."""
    known, known_prefixes, aliases = _schema_paths(model_engine)
    unknown = []
    for path in sorted(_leaf_paths(config)):
        if any(path == f or path.startswith(f + ".") for f in free_form) or path.startswith(aliases):
            continue
        if path not in known and path not in known_prefixes:
            unknown.append(path)
    return unknown


def _interpolated_paths(node: Any, prefix: str = "") -> set[str]:
    """Dotted paths of the nodes whose value is an interpolation (`${...}`)."""
    from omegaconf import DictConfig

    paths: set[str] = set()
    for key in node.keys():
        child = node._get_node(key)
        path = f"{prefix}.{key}" if prefix else str(key)
        if child._is_interpolation():
            paths.add(path)
        elif isinstance(child, DictConfig):
            paths |= _interpolated_paths(child, path)
    return paths
