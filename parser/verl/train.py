"""Launch ParSer GRPO training: verl 0.9.1's fully async v1 trainer on our Hydra configs.

    python -m parser.verl.train --config-name train/parser_4b parser.gateway_url=http://127.0.0.1:30000
    python -m parser.verl.train --config-name train/parser_9b trainer.save_freq=5
    recipes/train_parser_4b.sh      # starts the gateway too

What it adds to `python -m verl.trainer.main_ppo` (whose steps it then runs, by calling verl):
- the config dir is this repo's `configs/` (verl's own configs join through `hydra.searchpath`);
- `check_train_config` fails fast with the keys to fix (train_batch_size invariant, gateway URL,
  naive weight sync, removed `grad_offload`, ...), before Ray or any GPU starts;
- wandb runs offline unless you are logged in (`WANDB_API_KEY` or `wandb login`), so a run
  never blocks on a login prompt; `WANDB_MODE=online` forces it;
- the agent-loop YAML path becomes absolute, so Ray workers on other nodes find it.
"""
from __future__ import annotations

import netrc
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from parser.verl.config_checks import check_train_config

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "configs"


def wandb_logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def prepare(config: DictConfig) -> DictConfig:
    """Everything before verl takes over: env, absolute paths, resolution, checks."""
    os.environ.setdefault("WANDB_MODE", "online" if wandb_logged_in() else "offline")
    agent = config.actor_rollout_ref.rollout.agent
    path = Path(str(agent.agent_loop_config_path))
    if not path.is_absolute():
        candidates = [Path.cwd() / path, REPO / path]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            raise FileNotFoundError(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path}: not found in "
                                    f"{[str(c) for c in candidates]}")
        agent.agent_loop_config_path = str(found.resolve())
    OmegaConf.resolve(config)  # oc.env values are read here, in the launching shell's environment
    check_train_config(config)
    return config


@hydra.main(config_path=str(CONFIG_DIR), config_name="train/parser_4b", version_base=None)
def main(config: DictConfig) -> None:
    prepare(config)
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=TaskRunnerV1)


if __name__ == "__main__":
    main()
