"""ParSer's per-step training metrics: what the paper's training-dynamics figure plots.

Two halves, no verl import:
- `trajectory_metrics(trajectory)` — counts for one trajectory, computed in the rollout worker
  and shipped with the sample (`AgentLoopOutput.extra_fields["parser_stats"]`);
- `step_metrics(stats)` — pooled over the trajectories of one training step, logged under
  `parser/*` by `parser.train.sampler.ParserReplayBuffer` (wandb + console).

Rates are pooled (total invalid turns / total turns, not a mean of per-trajectory rates), so a
long trajectory weighs in proportion to what it did. Higher is better only for `reward` and
`answered`; the rest describe behaviour.

| logged key | meaning |
|---|---|
| parser/reward/mean | exact-match reward (verl also logs it as critic/score/mean) |
| parser/turns/{mean,max} | lead turns per trajectory |
| parser/lead_tokens_per_turn | lead-generated tokens per turn |
| parser/queries_per_turn | `query_agents` calls per turn (paper: 1.06 -> 1.62 for 9B) |
| parser/replies_per_query | non-abstaining subagent replies per query |
| parser/invalid_action_rate | turns with unusable output / turns (paper: 0.22% -> ~0) |
| parser/subagent_failures/sum | subagent requests that failed after retries (sum over the step) |
| parser/subagent_failure_rate | failed / all subagent requests |
| parser/answered | trajectories that ended with an answer |
| parser/truncated | trajectories cut at rollout.response_length |
| parser/grpo/solve_all | GRPO groups whose every trajectory was right (no signal) / groups |
| parser/grpo/solve_none | GRPO groups whose every trajectory was wrong (no signal) / groups |

A step of separate_async is `parameter_sync_step` mini-batches; verl's `MetricsAggregator`
(verl/trainer/ppo/v1/utils.py) reduces each key over them by its name: "max"/"min" keys by
max/min, "sum"/"total" keys by sum, the rest by a sample-weighted mean. The names above are
chosen so each lands on the reduction its meaning needs (tests/e2e/test_verl_trainer_on_cpu.py
checks it with verl's aggregator).

GRPO groups: with dynamic sampling on, verl evicts the no-signal groups before sampling and
reports them as `{reward: groups}`; the fractions count those and the sampled (mixed) groups.

The rollout-vs-actor log-probability gap is computed by verl itself from the rollout's
`rollout_log_probs` (needs `rollout.calculate_log_probs=true`) and the actor's recomputed
ones: `rollout_corr/log_ppl_abs_diff` is the paper's "absolute log-perplexity difference"
(≤ 1.41e-3 in the paper), next to `training/rollout_probs_diff_{mean,max}`.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from parser.records.trajectory import Trajectory

PREFIX = "parser"


def trajectory_metrics(trajectory: Trajectory) -> dict[str, float]:
    """Counts for one trajectory (sums, so steps can pool them)."""
    queries = [q for t in trajectory.turns for q in t.queries]
    calls = [c for q in queries for c in q.calls]
    return {
        "turns": float(trajectory.num_turns),
        "lead_tokens": float(sum(t.lead_tokens for t in trajectory.turns)),
        "queries": float(len(queries)),
        "replies": float(sum(c.status == "finding" for c in calls)),
        "invalid_actions": float(sum(t.action_error is not None for t in trajectory.turns)),
        "subagent_calls": float(len(calls)),
        "subagent_failures": float(sum(c.status == "failed" for c in calls)),
        "answered": float(trajectory.answer is not None),
    }


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def step_metrics(stats: Iterable[Mapping[str, Any]], rewards: Iterable[float] | None = None) -> dict[str, float]:
    """Pool per-trajectory `trajectory_metrics` (plus optional rewards) into logged step metrics."""
    stats = [s for s in stats if s]
    if not stats:
        return {}
    total = {key: sum(float(s.get(key, 0.0)) for s in stats) for key in stats[0]}
    n = len(stats)
    turns = [float(s["turns"]) for s in stats]
    out = {
        f"{PREFIX}/turns/mean": total["turns"] / n,
        f"{PREFIX}/turns/max": max(turns),
        f"{PREFIX}/lead_tokens_per_turn": _ratio(total["lead_tokens"], total["turns"]),
        f"{PREFIX}/queries_per_turn": _ratio(total["queries"], total["turns"]),
        f"{PREFIX}/replies_per_query": _ratio(total["replies"], total["queries"]),
        f"{PREFIX}/invalid_action_rate": _ratio(total["invalid_actions"], total["turns"]),
        f"{PREFIX}/subagent_failures/sum": total["subagent_failures"],
        f"{PREFIX}/subagent_failure_rate": _ratio(total["subagent_failures"], total["subagent_calls"]),
        f"{PREFIX}/answered": total["answered"] / n,
    }
    if "truncated" in total:
        out[f"{PREFIX}/truncated"] = total["truncated"] / n
    rewards = list(rewards or [])
    if rewards:
        out[f"{PREFIX}/reward/mean"] = sum(float(r) for r in rewards) / len(rewards)
    return out


def group_metrics(group_rewards: Mapping[str, Iterable[float]], evicted: Mapping[float, int] | None = None) -> dict[str, float]:
    """GRPO solve-all / solve-none fractions over sampled groups (uid -> rewards) plus groups
    verl evicted as uniform (`{shared reward: group count}`)."""
    solved_all = solved_none = 0
    for rewards in group_rewards.values():
        rewards = [float(r) for r in rewards]
        solved_all += all(r >= 1.0 for r in rewards)
        solved_none += all(r <= 0.0 for r in rewards)
    evicted = {float(k): int(v) for k, v in (evicted or {}).items()}
    solved_all += sum(n for r, n in evicted.items() if r >= 1.0)
    solved_none += sum(n for r, n in evicted.items() if r <= 0.0)
    groups = len(group_rewards) + sum(evicted.values())
    if not groups:
        return {}
    return {f"{PREFIX}/grpo/solve_all": solved_all / groups, f"{PREFIX}/grpo/solve_none": solved_none / groups}
