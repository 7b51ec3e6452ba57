"""ParSer inside verl 0.9.1's fully asynchronous GRPO trainer, through verl's plugin points only.

Only the lead agent is trained; the frozen subagents sit behind the gateway. Each piece plugs
into one documented verl extension point, so no verl file is copied or patched. The agent loops
themselves (`actor_rollout_ref.rollout.agent.agent_loop_config_path`, one row each in
configs/train/agent_loop.yaml) live in their methods' folders (`parser/methods/<name>/train.py`):
this package imports no method.

| module | verl plugin point | job |
|---|---|---|
| `worker` | (what an agent loop builds once per rollout worker) | the gateway session, the reader and the engines of episode-engine trajectories |
| `server_manager` | the agent loop's `self.server_manager` | verl's rollout client as a `parser.serving.types.Backend` |
| `reward` | `reward.custom_reward_function` | `compute_score`: EM on the extracted answer |
| `sampler` | `trainer.v1.sampler.custom_sampler` | verl's async replay buffer, plus per-step ParSer metrics and InfoMem's group step |
| `infomem/` | (pure functions) | InfoMem in verl: compose a GRPO group's rewards from EM and gains, its step metrics |
| `metrics` | (pure functions) | trajectory stats -> logged step metrics |
| `config_checks` / `train` | `verl.trainer.main_ppo.run_ppo` | fail fast on bad configs, then launch |
| `ray_start` | (around `run_ppo`) | start the local Ray cluster again after Ray's start-up deadline ran out |
| `cpu/` | platform, engine, rollout and checkpoint-engine registries | the same trainer on a CPU (CI, laptops) |

    parser train --config-name train/parser_4b parser.gateway_url=http://127.0.0.1:30000
    recipes/train_cpu_smoke.sh          # 2 real GRPO steps of a tiny lead on this machine

Importing this package does not import verl (the reward function runs in verl's reward
workers, the metrics in tests without Ray); the modules that need verl import it themselves.
"""
