"""InfoMem (`parser.info_gain`) inside verl 0.9.1's trainer: where each half of the reward runs.

- Per trajectory, in the rollout worker (`ParserAgentLoop`): a successful trajectory's gain,
  scored by the policy (`scorer: policy`, verl's rollout servers through
  `ServerManagerBackend.score`) or the frozen subagent model (`scorer: subagent`, the gateway
  client), lands in `extra_fields["info_gain"]` (a `GainRecord`, which names the scorer). Its
  `reward_score` stays the EM, as does `reward_extra_info.acc`.
- Per GRPO group, in the replay buffer (`ParserReplayBuffer`, verl's
  `trainer.v1.sampler.custom_sampler`): once all n trajectories of a prompt have finished, and
  before verl's dynamic sampling classifies the group or any advantage exists, `compose_groups`
  turns each EM into R = EM + beta * 1[EM = 1] * Norm_group(gain) and the buffer writes R into
  the trajectories' `rm_scores` in TransferQueue. verl's GRPO advantage ((R - mean) / std over
  the group) and its `critic/score` metrics then see the composed reward; no verl file changes.

Composition is idempotent: R is recomputed from `acc` (never overwritten) and the stored gains,
so a group composed twice (a restarted trainer finding it in TransferQueue) gets the same scores.
A trajectory of several outputs (verl keys `{uid}_{session}_{index}`) is scored by its last
output, and every output of it gets that score, as verl shares the final reward.

Dynamic sampling (`algorithm.filter_groups`): composition makes an all-correct group's rewards
unequal whenever its gains differ, so the choice of `filter_groups.metric` decides what InfoMem
trains on. `train/parser_4b_infomem` filters on `acc` (the EM): groups without an outcome signal
are still evicted, and the gain only ranks the correct trajectories of mixed groups, where beta
weighs it against the outcome. Filtering on `reward` (the composed score) keeps all-correct
groups with distinct gains; with `algorithm.norm_adv_by_std_in_grpo` their advantages are the
gain's z-scores at full GRPO scale whatever beta is (beta cancels in (R - mean) / std), i.e. a
likelihood signal trained as strongly as the outcome. docs/info_gain.md has the argument.

No verl import (pure functions over keys and `extra_fields` rows); `parser.train.sampler` does the
TransferQueue reads and writes.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from parser.train.infomem.gain import SCORING_FAILED, SUCCESS, InfoGainConfig, compose, usable_gain

PREFIX = "parser/info_gain"
CHANGED_TOL = 1e-9  # a composed reward this close to the EM counts as unchanged


def _acc(row: Any) -> float | None:
    info = (row or {}).get("reward_extra_info") if isinstance(row, dict) else None
    return float(info["acc"]) if isinstance(info, dict) and "acc" in info else None


def _gain(row: Any) -> float | None:
    """The row's stored gain; None when it has none or it is not a usable number (a record read
    back from TransferQueue is data: a NaN or a string there is no gain, never a reward)."""
    record = row.get("info_gain") if isinstance(row, dict) else None
    gain = record.get("gain") if isinstance(record, dict) else None
    return float(gain) if usable_gain(gain) else None


def final_outputs(keys: Sequence[str]) -> dict[str, dict[str, int]]:
    """uid -> {session key -> row index of that session's last output} (verl's key layout)."""
    groups: dict[str, dict[str, tuple[int, int]]] = {}
    for row, key in enumerate(keys):
        session, index = key.rsplit("_", 1)
        uid = session.rsplit("_", 1)[0]
        best = groups.setdefault(uid, {}).get(session)
        if best is None or best[0] < int(index):
            groups[uid][session] = (int(index), row)
    return {uid: {s: row for s, (_, row) in sessions.items()} for uid, sessions in groups.items()}


def compose_groups(keys: Sequence[str], rows: Sequence[Any], config: InfoGainConfig) -> list[float | None]:
    """The composed reward of each row (every output of a session gets its session's), grouped
    by uid; None for a row whose session has no EM recorded (not from parser_agent)."""
    session_score: dict[str, float | None] = {}
    for sessions in final_outputs(keys).values():
        names = list(sessions)
        outcomes = [_acc(rows[sessions[s]]) for s in names]
        known = [i for i, o in enumerate(outcomes) if o is not None]
        composed = compose([outcomes[i] for i in known], [_gain(rows[sessions[names[i]]]) for i in known], config)
        session_score.update({s: None for s in names})
        session_score.update({names[i]: r for i, r in zip(known, composed, strict=True)})
    return [session_score[key.rsplit("_", 1)[0]] for key in keys]


def info_gain_metrics(keys: Sequence[str], rows: Sequence[Any], scores: Sequence[float],
                      tags: Sequence[Mapping[str, Any]] | None = None) -> dict[str, float]:
    """Step metrics over the sampled trajectories (their last outputs), padding skipped:

    | key | meaning |
    |---|---|
    | parser/info_gain/gain/mean, gain/std | raw gain of the successful trajectories that have one |
    | parser/info_gain/groups_changed | sampled groups where composition changed some reward / groups |
    | parser/info_gain/scored_fraction | successes with a gain / successes that carry a record |
    | parser/info_gain/bonus_abs/mean | mean |R - EM| over successes (the shaping actually applied) |
    | parser/info_gain/failures/sum | trajectories whose scoring failed after retries |
    | parser/info_gain/unrecorded/sum | trajectories generated without InfoMem (no record): trained on EM |

    `unrecorded`: verl checkpoints the replay buffer with the weights, so a run resumed with
    InfoMem turned on first trains on groups the earlier launch generated under EM alone.
    """
    gains, bonuses, successes, scored, failures, unrecorded = [], [], 0, 0, 0, 0
    changed = groups = 0
    for sessions in final_outputs(keys).values():
        rows_of = [r for r in sessions.values() if not (tags and tags[r].get("is_padding"))]
        if not rows_of:
            continue
        groups += 1
        group_changed = False
        for r in rows_of:
            acc, record = _acc(rows[r]), rows[r].get("info_gain") if isinstance(rows[r], dict) else None
            if acc is None:
                continue
            group_changed |= abs(float(scores[r]) - acc) > CHANGED_TOL
            if not isinstance(record, dict):
                unrecorded += 1
                continue
            failures += str(record.get("error") or "").startswith(SCORING_FAILED)
            if acc >= SUCCESS:
                successes += 1
                bonuses.append(abs(float(scores[r]) - acc))
                if _gain(rows[r]) is not None:
                    scored += 1
                    gains.append(_gain(rows[r]))
        changed += group_changed
    if not groups:
        return {}
    out = {f"{PREFIX}/groups_changed": changed / groups, f"{PREFIX}/failures/sum": float(failures),
           f"{PREFIX}/unrecorded/sum": float(unrecorded)}
    if successes:
        out[f"{PREFIX}/scored_fraction"] = scored / successes
        out[f"{PREFIX}/bonus_abs/mean"] = sum(bonuses) / len(bonuses)
    if gains:
        mean = sum(gains) / len(gains)
        out[f"{PREFIX}/gain/mean"] = mean
        out[f"{PREFIX}/gain/std"] = (sum((g - mean) ** 2 for g in gains) / len(gains)) ** 0.5
    return out
