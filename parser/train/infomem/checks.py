"""InfoMem's launch checks: `parser.info_gain` values that the agent loop and the replay buffer
would refuse minutes into a run, and a policy scorer on a rollout server that cannot score.

Why a module of its own: `parser.train.config_checks` checks what every run shares and asks the
selected agent loop for its own checks; InfoMem is neither (any loop may train with it), so its
checks sit in its folder and config_checks calls them for every run.
"""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from parser.train.infomem.gain import InfoGainConfig

# The rollout servers that answer verl's `prompt_logprobs` (InfoMem's policy scorer).
PROMPT_LOGPROB_ROLLOUTS = ("sglang", "vllm", "parser_cpu")


def info_gain_problems(settings: Any, rollout: Any) -> list[str]:
    """What is wrong with `parser.info_gain` (`settings`) for this `actor_rollout_ref.rollout`."""
    if settings is None:
        return []
    try:
        config = InfoGainConfig.from_settings(OmegaConf.to_container(settings) if isinstance(settings, DictConfig) else settings)
    except (TypeError, ValueError) as error:
        return [str(error)]
    if config.enable and config.scorer == "policy" and rollout.name not in PROMPT_LOGPROB_ROLLOUTS:
        return [f"parser.info_gain.scorer=policy needs a rollout server that answers prompt_logprobs "
                f"({', '.join(PROMPT_LOGPROB_ROLLOUTS)}); actor_rollout_ref.rollout.name={rollout.name}"]
    return []
