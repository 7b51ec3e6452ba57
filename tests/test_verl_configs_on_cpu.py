"""Every shipped training config composes with verl 0.9.1's schema and says what Table 9 says.

    .venv/bin/pytest tests/test_verl_configs_on_cpu.py -q

Composition goes through Hydra exactly as `python -m parser.train` does (our configs/ dir,
verl's configs via `hydra.searchpath`), then through verl's own `validate_config` and its
dataclass schema (`omega_conf_to_dataclass`), so a renamed or removed verl key fails here.
"""
from __future__ import annotations

import copy
import functools
import os

import pytest

pytest.importorskip("verl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.errors import ConfigCompositionException  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from parser.base.config import EpisodeConfig  # noqa: E402
from parser.train.worker import episode_config  # noqa: E402
from parser.train.config_checks import TrainConfigError, check_train_config  # noqa: E402
from parser.train.train import CONFIG_DIR, prepare  # noqa: E402

SHIPPED = sorted(f"train/{p.stem}" for p in (CONFIG_DIR / "train").glob("parser_*.yaml") if p.stem != "parser_base")
TABLE9 = [name for name in SHIPPED if not name.endswith(("_release", "_infomem"))]  # the paper's runs
GATEWAY = "parser.gateway_url=http://127.0.0.1:30000"


@functools.lru_cache(maxsize=None)
def _composed(name: str, overrides: tuple[str, ...]):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def compose_config(name: str, overrides: list[str] = ()):  # type: ignore[assignment]
    """Hydra composes each (name, overrides) once per module (~0.5-1 s of CPU each; this module asks
    for train/parser_4b a dozen times); every caller gets its own copy, which `prepare` may change.
    Interpolations stay unresolved in the copy, so `${oc.env:...}` still reads the test's environment."""
    return copy.deepcopy(_composed(name, tuple(overrides)))


def test_shipped_configs_are_the_4b_and_9b_runs_and_the_release_and_infomem_runs():
    assert SHIPPED == ["train/parser_4b", "train/parser_4b_infomem", "train/parser_4b_release", "train/parser_9b"]
    assert TABLE9 == ["train/parser_4b", "train/parser_9b"]  # the release run: tests/test_release_protocol_on_cpu.py


def test_infomem_is_off_in_the_paper_presets_and_the_4b_run_plus_the_gain_in_its_own():
    from parser.train.infomem.gain import InfoGainConfig

    for name in SHIPPED:
        if name != "train/parser_4b_infomem":
            assert not compose_config(name, [GATEWAY]).parser.info_gain.enable, name
    infomem = prepare(compose_config("train/parser_4b_infomem", [GATEWAY]))
    plain = prepare(compose_config("train/parser_4b", [GATEWAY]))
    config = InfoGainConfig.from_settings(OmegaConf.to_container(infomem.parser.info_gain))
    assert config.enable and (config.beta, config.normalization, config.scorer) == (0.2, "zscore", "subagent")
    # the replay buffer, which composes the groups, gets the same settings
    assert infomem.trainer.v1.sampler.sampler_kwargs.info_gain == infomem.parser.info_gain
    # dynamic sampling still judges groups by their EM (parser/train/infomem/group.py says why)
    assert infomem.algorithm.filter_groups.metric == "acc" and infomem.trainer.v1.sampler.sampler_kwargs.filter_groups_metric == "acc"
    a, b = _flat(OmegaConf.to_container(infomem)), _flat(OmegaConf.to_container(plain))
    assert {key for key in a.keys() | b.keys() if a.get(key) != b.get(key)} == {
        "parser.info_gain.enable", "trainer.v1.sampler.sampler_kwargs.info_gain.enable",
        "algorithm.filter_groups.metric", "trainer.v1.sampler.sampler_kwargs.filter_groups_metric",
        "trainer.experiment_name", "trainer.default_local_dir", "actor_rollout_ref.rollout.trace.experiment_name"}


def _flat(tree, prefix=""):
    if not isinstance(tree, dict):
        return {prefix: tree}
    return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}.{key}" if prefix else key).items()}


@pytest.mark.parametrize("name", TABLE9)
def test_config_composes_and_passes_verl_validation(name):
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import McoreActorConfig, RolloutConfig

    config = prepare(compose_config(name, [GATEWAY]))
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    assert need_reference_policy(config) and not need_critic(config)  # KL loss needs the ref; GRPO has no critic

    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    algorithm = omega_conf_to_dataclass(config.algorithm)
    assert isinstance(actor, McoreActorConfig) and isinstance(rollout, RolloutConfig) and isinstance(algorithm, AlgoConfig)

    # Table 9, actor optimisation
    assert actor.optim.optimizer == "adam" and actor.optim.lr == 1e-6
    assert actor.optim.lr_warmup_steps == 15 and actor.optim.lr_decay_style == "constant"
    assert tuple(actor.optim.betas) == (0.9, 0.999) and actor.optim.weight_decay == 0.01
    assert actor.optim.clip_grad == 1.0
    assert actor.ppo_mini_batch_size == 128  # prompts; the workers multiply by rollout.n
    assert (actor.clip_ratio, actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.2, 0.2)
    assert actor.entropy_coeff == 0
    assert actor.use_kl_loss and actor.kl_loss_coef == 1e-3 and actor.kl_loss_type == "low_var_kl"
    assert actor.loss_agg_mode == "seq-mean-token-mean"
    # Megatron backend
    mg = actor.megatron
    assert (mg.tensor_model_parallel_size, mg.pipeline_model_parallel_size, mg.context_parallel_size,
            mg.expert_model_parallel_size) == (1, 1, 1, 1)
    assert mg.param_offload and mg.optimizer_offload and mg.dtype == "bfloat16"
    assert actor.strategy == "megatron"
    # asynchronous training
    assert rollout.name == "sglang" and rollout.mode == "async" and rollout.gpu_memory_utilization == 0.8
    assert (rollout.nnodes, rollout.n_gpus_per_node) == (1, 4)
    assert (config.trainer.nnodes, config.trainer.n_gpus_per_node) == (1, 2)
    assert rollout.checkpoint_engine.backend == "nccl"
    t = config.trainer
    assert t.use_v1 and t.v1.trainer_mode == "separate_async"
    assert t.v1.separate_async.parameter_sync_step == 4 and t.v1.sampler.max_off_policy_threshold == 2
    assert config.data.train_batch_size == 4 * 128
    assert config.algorithm.filter_groups.enable and t.v1.sampler.sampler_kwargs.dynamic_sampling
    assert t.save_freq == 10 and t.resume_mode == "auto"
    # lead agent
    assert algorithm.adv_estimator == "grpo" and rollout.n == 5
    assert (rollout.temperature, rollout.top_p, rollout.top_k) == (1.0, 1.0, -1)
    assert rollout.calculate_log_probs
    # episode (the engine's config, bounded by verl's response length)
    ep = episode_config(OmegaConf.to_container(config.parser.episode), rollout.response_length)
    assert isinstance(ep, EpisodeConfig)
    assert (ep.max_turns, ep.max_tokens_per_turn, ep.chunk_size) == (9, 2048, 512)
    assert (ep.subagent_temperature, ep.subagent_max_tokens) == (0.7, 512)
    assert ep.max_response_tokens == config.data.max_response_length
    # plugin points resolve to our code
    assert config.reward.custom_reward_function.path == "pkg://parser.train.reward"
    assert os.path.isabs(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)


def test_model_paths_differ_by_size():
    paths = {name: compose_config(name, [GATEWAY]).actor_rollout_ref.model.path for name in TABLE9}
    assert paths == {"train/parser_4b": "Qwen/Qwen3.5-4B", "train/parser_9b": "Qwen/Qwen3.5-9B"}


def test_agent_loop_yaml_registers_parser_agent():
    from hydra.utils import get_class

    entries = OmegaConf.load(CONFIG_DIR / "train" / "agent_loop.yaml")
    (entry,) = [e for e in entries if e.name == "parser_agent"]
    cls = get_class(entry._target_)
    from verl.experimental.agent_loop import AgentLoopBase

    assert issubclass(cls, AgentLoopBase)


def test_batch_invariant_fails_with_a_clear_message():
    config = compose_config("train/parser_4b", [GATEWAY, "data.train_batch_size=256"])
    with pytest.raises(TrainConfigError, match=r"data.train_batch_size=256 must equal .*parameter_sync_step \(4\) x .*"
                                               r"ppo_mini_batch_size \(128\) = 512"):
        prepare(config)


def test_missing_gateway_is_rejected(monkeypatch):
    monkeypatch.delenv("PARSER_GATEWAY_URL", raising=False)
    config = compose_config("train/parser_4b")
    with pytest.raises(TrainConfigError, match="parser.gateway_url is not set"):
        prepare(config)


def test_gateway_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("PARSER_GATEWAY_URL", "http://10.0.0.7:30000")
    config = prepare(compose_config("train/parser_4b"))
    assert config.parser.gateway_url == "http://10.0.0.7:30000"


def test_removed_grad_offload_key_fails_hydra_validation():
    with pytest.raises(ConfigCompositionException, match="grad_offload"):
        compose_config("train/parser_4b", [GATEWAY, "actor_rollout_ref.actor.megatron.grad_offload=true"])


def test_naive_weight_sync_is_rejected():
    config = compose_config("train/parser_4b", [GATEWAY, "actor_rollout_ref.rollout.checkpoint_engine.backend=naive"])
    with pytest.raises(TrainConfigError, match="naive"):
        check_train_config(config)


# ----------------------------------------------------------------------------- schema, CPU, staleness
@pytest.mark.parametrize("name,engine", [*((n, "megatron") for n in SHIPPED), ("train/memagent_4b", "megatron"),
                                         ("train/cpu_smoke", "dp"), ("train/cpu_learn", "dp")])
def test_every_key_set_in_our_yaml_exists_in_verls_schema(name, engine):
    from parser.train.config_checks import unknown_keys

    config = compose_config(name, [GATEWAY])
    assert config.model_engine == engine  # the launch check compares against this engine's schema
    assert unknown_keys(config, engine) == []


def test_a_typo_in_a_yaml_file_is_caught(tmp_path):
    """Hydra merges an unknown key from a YAML file silently; the schema check does not."""
    import shutil

    from parser.train.config_checks import unknown_keys

    configs = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, configs)
    base = configs / "train" / "parser_base.yaml"
    base.write_text(base.read_text().replace("    clip_ratio_high: 0.2\n", "    clip_ratio_high: 0.2\n    clip_ration: 0.3\n"))
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        config = compose(config_name="train/parser_4b", overrides=[GATEWAY])  # composes without complaint
    assert config.actor_rollout_ref.actor.clip_ration == 0.3
    assert unknown_keys(config, "megatron") == ["actor_rollout_ref.actor.clip_ration"]


def test_the_launch_check_refuses_a_typo_in_a_users_own_config(tmp_path):
    """A user's run config (shaped like train/parser_9b.yaml) with a misspelt key: `parser.train` stops
    before Ray starts; verl alone would train at the default temperature."""
    import shutil

    configs = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, configs)
    (configs / "train" / "my_run.yaml").write_text(
        "# @package _global_\nhydra:\n  searchpath:\n    - pkg://verl.trainer.config\n"
        "defaults:\n  - parser_base\n  - _self_\n"
        "actor_rollout_ref:\n  model:\n    path: Qwen/Qwen3.5-4B\n  rollout:\n    temprature: 0.8\n"
        "trainer:\n  total_epochs: 2\n")
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        config = compose(config_name="train/my_run", overrides=[GATEWAY])
    with pytest.raises(TrainConfigError, match=r"not in verl's schema \(model_engine=megatron\): "
                                               r"actor_rollout_ref\.rollout\.temprature;"):
        prepare(config)
    fixed = compose_config("train/parser_4b", [GATEWAY, "actor_rollout_ref.rollout.temperature=0.8"])
    prepare(fixed)  # the right spelling passes


@pytest.mark.parametrize("name", ["train/cpu_smoke", "train/cpu_learn"])
def test_cpu_runs_are_the_4b_run_on_the_cpu_engine(name):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    smoke = prepare(compose_config(name, [GATEWAY, "actor_rollout_ref.model.path=/m",
                                                       "data.train_files=/t", "data.val_files=/v"]))
    validate_config(config=smoke, use_reference_policy=need_reference_policy(smoke), use_critic=need_critic(smoke))
    full = prepare(compose_config("train/parser_4b", [GATEWAY]))
    # same composition: algorithm, loop, sampler, reward, trainer mode
    for key in ("algorithm", "reward.custom_reward_function", "trainer.v1.sampler.custom_sampler",
                "trainer.v1.sampler.max_off_policy_threshold", "trainer.v1.sampler.max_off_policy_strategy",
                "actor_rollout_ref.rollout.agent.agent_loop_config_path"):
        assert OmegaConf.select(smoke, key) == OmegaConf.select(full, key), key
    assert smoke.trainer.v1.trainer_mode == "separate_async" and smoke.actor_rollout_ref.hybrid_engine is False
    assert smoke.actor_rollout_ref.actor.use_kl_loss and smoke.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-mean"
    # device
    assert (smoke.trainer.device, smoke.actor_rollout_ref.actor.strategy) == ("cpu", "fsdp2")
    assert smoke.actor_rollout_ref.rollout.name == "parser_cpu" and smoke.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert smoke.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert smoke.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1
    # the CPU engine's Ray settings (configs/train/engine/cpu.yaml, once for every CPU run): Ray's
    # default niceness 15 starved the trainer behind every other process on a shared machine
    assert smoke.ray_kwargs.ray_init._system_config.worker_niceness == 0
    assert not smoke.actor_rollout_ref.actor.fsdp_config.use_torch_compile
    assert not smoke.actor_rollout_ref.ref.fsdp_config.use_torch_compile
    env = smoke.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_PLATFORM == "cpu" and env.VERL_USE_EXTERNAL_MODULES == "parser.train.cpu"
    assert "VERL_PLATFORM" not in full.ray_kwargs.ray_init.runtime_env.env_vars


def test_megatron_recomputes_through_its_own_settings():
    """model.enable_gradient_checkpointing is read by the FSDP/VeOmni engines only."""
    config = compose_config("train/parser_4b", [GATEWAY])
    recompute = config.actor_rollout_ref.actor.megatron.override_transformer_config
    assert (recompute.recompute_granularity, recompute.recompute_method, recompute.recompute_num_layers) == ("full", "uniform", 1)
    assert config.actor_rollout_ref.actor.strategy == "megatron"
    assert compose_config("train/cpu_smoke", [GATEWAY]).actor_rollout_ref.model.enable_gradient_checkpointing


@pytest.mark.parametrize("requested,expected", [(None, "WARN"), ("INFO", "WARN"), ("debug", "WARN"), ("ERROR", "ERROR")])
def test_verl_log_level_avoids_the_separate_async_info_crash(requested, expected):
    from parser.train.train import verl_log_level

    config = compose_config("train/parser_4b", [GATEWAY])
    assert verl_log_level(config, requested) == expected
    hybrid = compose_config("train/parser_4b", [GATEWAY, "actor_rollout_ref.hybrid_engine=true"])
    assert verl_log_level(hybrid, "INFO") == "INFO"  # the crashing log call is only on the hybrid_engine=false path


def test_the_releases_dropless_staleness_is_one_override():
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    config = compose_config("train/parser_4b", [GATEWAY, "trainer.v1.sampler.max_off_policy_strategy=wait"])
    sampler = config.trainer.v1.sampler
    buffer = ReplayBufferAsync(trainer_mode="separate_async", trainer_config=config.trainer.v1.separate_async,
                               max_off_policy_threshold=sampler.max_off_policy_threshold,
                               max_off_policy_strategy=sampler.max_off_policy_strategy, refill_fn=lambda n: None,
                               sampler_kwargs={})
    assert (buffer.max_off_policy_threshold, buffer.max_off_policy_strategy) == (2, "wait")
    assert compose_config("train/parser_4b", [GATEWAY]).trainer.v1.sampler.max_off_policy_strategy == "drop"


def test_bad_info_gain_settings_fail_before_launch():
    for override, needle in (("parser.info_gain.normalization=rank", "normalization"),
                             ("+parser.info_gain.betta=0.1", "unknown key"),
                             ("actor_rollout_ref.rollout.name=trtllm", "prompt_logprobs")):
        config = compose_config("train/parser_4b_infomem", [GATEWAY, "parser.info_gain.scorer=policy", override])
        with pytest.raises(TrainConfigError, match=needle):
            prepare(config)


def test_memagent_preset_is_the_same_trainer_with_the_memory_agent_as_policy():
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from parser.train.infomem.gain import InfoGainConfig

    config = prepare(compose_config("train/memagent_4b"))  # no gateway: memory agents read alone
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    assert config.parser.memagent.method == "memagent" and config.algorithm.filter_groups.metric == "acc"
    assert not config.parser.info_gain.enable  # outcome reward; InfoMem is one override
    assert InfoGainConfig.from_settings(OmegaConf.to_container(config.parser.info_gain)).scorer == "policy"
    plain = prepare(compose_config("train/parser_4b", [GATEWAY]))
    for key in ("trainer.use_v1", "trainer.v1.trainer_mode", "algorithm.adv_estimator", "actor_rollout_ref.actor.optim",
                "actor_rollout_ref.rollout.n", "trainer.v1.sampler.custom_sampler"):
        assert OmegaConf.select(config, key) == OmegaConf.select(plain, key), key
    prompt, response = config.actor_rollout_ref.rollout.prompt_length, config.actor_rollout_ref.rollout.response_length
    assert prompt >= config.parser.memagent.chunk_size + config.parser.memagent.max_memory_tokens
    assert response >= config.parser.memagent.max_memory_tokens


def test_the_loop_a_config_selects_checks_its_own_settings():
    """config_checks names no method: it asks the agent-loop row that default_agent_loop names.
    Before, it branched on `parser.memagent`, so a memory-agent run with a bad method or the subagent
    InfoMem scorer failed only minutes in, inside a rollout worker."""
    assert prepare(compose_config("train/memagent_4b")).actor_rollout_ref.rollout.agent.default_agent_loop == "memagent_agent"
    for override, needle in (("parser.memagent.method=rag", "not a memory agent"),
                             ("parser.memagent.reward=f1", "parser.memagent.reward"),
                             ("parser.info_gain.enable=true parser.info_gain.scorer=subagent", "no subagent model"),
                             ("actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent", "not a row of")):
        with pytest.raises(TrainConfigError, match=needle):
            prepare(compose_config("train/memagent_4b", override.split()))
    with pytest.raises(TrainConfigError, match="gateway_url is not set"):  # the ParSer loop needs its subagents
        prepare(compose_config("train/parser_4b"))


def test_cpu_learn_samples_at_its_episode_presets_temperature_with_invalid_turns_masked():
    """train/cpu_learn's rollout temperature is the episode preset's (configs/episode/learn_cpu.yaml),
    which its sampled eval reads; the trajectories record it, and invalid turns are masked (docs/learning.md)."""
    config = prepare(compose_config("train/cpu_learn", [GATEWAY, "actor_rollout_ref.model.path=/m",
                                                        "data.train_files=/t", "data.val_files=/v"]))
    preset = OmegaConf.load(os.path.join(os.path.dirname(__file__), "..", "configs", "episode", "learn_cpu.yaml"))
    assert config.actor_rollout_ref.rollout.temperature == preset.lead_temperature == config.parser.episode.lead_temperature
    assert config.parser.episode.train_invalid_turns is False
    paper = prepare(compose_config("train/parser_4b", [GATEWAY]))
    assert paper.actor_rollout_ref.rollout.temperature == 1.0 and paper.parser.episode.train_invalid_turns is True
