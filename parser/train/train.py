"""Launch ParSer GRPO training: verl 0.9.1's fully async v1 trainer on our Hydra configs.

    parser train --config-name train/parser_4b parser.gateway_url=http://127.0.0.1:30000
    parser train --config-name train/parser_9b trainer.save_freq=5
    recipes/train_parser_4b.sh      # starts the gateway too

What it adds to `python -m verl.trainer.main_ppo` (whose steps it then runs, by calling verl):
- the config dir is this repo's `configs/` (verl's own configs join through `hydra.searchpath`);
- `check_train_config` fails fast with the keys to fix (train_batch_size invariant, gateway URL,
  naive weight sync, removed `grad_offload`, ...), before Ray or any GPU starts;
- `check_machine` refuses, before the config is printed or Ray starts, on a machine that cannot
  run it (no CUDA GPU for a GPU engine, `megatron.core` missing, train/val files missing), saying
  what to do (parser/train/machine.py); exit 2;
- a finished run prints where its checkpoint is and the next commands (merge -> eval);
- a local Ray start that ran past Ray's fixed start-up deadline on a busy machine is cleaned up
  and started again, up to 5 times (parser/train/ray_start.py);
- wandb runs offline unless you are logged in (`WANDB_API_KEY` or `wandb login`), so a run
  never blocks on a login prompt; `WANDB_MODE=online` forces it;
- the agent-loop YAML path becomes absolute, so Ray workers on other nodes find it;
- `trainer.device: cpu` (configs/train/engine/cpu.yaml) loads parser/train/cpu into every verl
  process (`VERL_PLATFORM`, `VERL_USE_EXTERNAL_MODULES`, here and in Ray's runtime env);
- verl's log level is WARN in every process unless you set `VERL_LOGGING_LEVEL` (see
  `verl_log_level`: at INFO, verl 0.9.1's separate_async trainer crashes while starting).
"""
from __future__ import annotations

import importlib
import netrc
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from parser.base.resources import config_dir, config_file
from parser.train.config_checks import check_train_config
from parser.train.machine import MachineError, check_machine, closing_lines
from parser.train.ray_start import retry_ray_start

CONFIG_DIR = config_dir()
# The verl levels at which verl 0.9.1's separate_async trainer raises while starting (below).
CRASHING_LOG_LEVELS = ("INFO", "DEBUG", "NOTSET")


def wandb_logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def verl_log_level(config: DictConfig, requested: str | None) -> str:
    """verl's log level for this run: WARN unless asked otherwise, and never INFO/DEBUG where it crashes.

    verl 0.9.1 bug: with `actor_rollout_ref.hybrid_engine: false` in separate_async mode,
    `PPOTrainerSeparateAsync._setup` (verl/trainer/ppo/v1/trainer_separate_async.py, line 181-185)
    calls `logger.info(..., flush=True)`; the standard logger takes no `flush`, so at INFO the
    trainer dies with `TypeError: Logger._log() got an unexpected keyword argument 'flush'`
    before its first step. At WARN the call is filtered out before the bad argument is seen.
    """
    level = (requested or "WARN").upper()
    separate = config.trainer.use_v1 and config.trainer.v1.trainer_mode == "separate_async"
    if separate and not config.actor_rollout_ref.get("hybrid_engine", True) and level in CRASHING_LOG_LEVELS:
        print(f"parser.train: VERL_LOGGING_LEVEL={level} -> WARN (verl 0.9.1's separate_async trainer "
              "raises at INFO with hybrid_engine=false; see parser.train.train.verl_log_level)", flush=True)
        return "WARN"
    return level


def verl_env(config: DictConfig) -> dict[str, str]:
    """Environment every verl process needs for this config (driver and Ray workers)."""
    env = {"VERL_LOGGING_LEVEL": verl_log_level(config, os.environ.get("VERL_LOGGING_LEVEL"))}
    if config.trainer.get("device") == "cpu":
        # keep any modules the user loads too
        modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
        env.update({"VERL_PLATFORM": "cpu",
                    "VERL_USE_EXTERNAL_MODULES": ",".join(dict.fromkeys(["parser.train.cpu", *modules]))})
    return env


def prepare(config: DictConfig) -> DictConfig:
    """Everything before verl takes over: env, absolute paths, resolution, checks."""
    os.environ.setdefault("WANDB_MODE", "online" if wandb_logged_in() else "offline")
    with open_dict(config):  # Ray workers get it from the runtime env; main() sets it here
        env_vars = config.ray_kwargs.ray_init.runtime_env.env_vars
        for key, value in verl_env(config).items():
            env_vars[key] = value
    agent = config.actor_rollout_ref.rollout.agent
    path = config_file(str(agent.agent_loop_config_path))
    if not path.is_file():
        raise FileNotFoundError(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent.agent_loop_config_path}: "
                                f"not found from {Path.cwd()} nor in the shipped configs ({config_dir()})")
    agent.agent_loop_config_path = str(path.resolve())
    OmegaConf.resolve(config)  # oc.env values are read here, in the launching shell's environment
    check_train_config(config)
    return config


@hydra.main(config_path=str(CONFIG_DIR), config_name="train/parser_4b", version_base=None)
def main(config: DictConfig) -> None:
    prepare(config)
    try:
        check_machine(config, CONFIG_DIR / "data")
    except MachineError as error:
        print(f"parser.train: {error}", file=sys.stderr)
        sys.exit(2)
    os.environ.update({k: str(v) for k, v in config.ray_kwargs.ray_init.runtime_env.env_vars.items()})
    # Hydra already imported `verl` (for its config search path) before prepare() set
    # VERL_USE_EXTERNAL_MODULES, so load the modules here too, before verl resolves its platform.
    for module in filter(None, os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",")):
        importlib.import_module(module)
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    retry_ray_start(lambda: run_ppo(config, task_runner_class=TaskRunnerV1))
    print("\n".join(closing_lines(config)), flush=True)


if __name__ == "__main__":
    main()
