"""The training reward: binary exact match of the lead's final answer (paper §2.3).

Two doors, one definition (`parser.text.reward.exact_match`):
- the agent loop scores its own trajectory (`score_answer`) and sets `reward_score`, so verl's
  reward workers are skipped and dynamic sampling sees the reward as soon as a group finishes;
- `compute_score` is verl's reward-manager signature, for the `reward.custom_reward_function`
  path (`pkg://parser.train.reward`, name `compute_score`). There `solution_str` is the decoded
  *whole* response, observations included — a subagent's finding quoted in an observation
  must never count as the lead's answer — so the answer is read from `extra_info`, where the
  agent loop's `extra_fields` land (verl's naive reward manager merges them in).

Which EM is the protocol's (`parser.engine.protocol`): the agent loop hands its protocol object to
`score_answer`; across verl's process boundary the protocol travels as its key in `extra_info`,
and `compute_score` turns it back into the object with `parser.engine.protocol.protocol_for`.

No verl import: this module is loaded by verl's reward workers and by plain tests alike.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from parser.base.config import EpisodeConfig
from parser.engine.protocol import Protocol, protocol_for

ANSWER_KEY = "parser_answer"  # extra_fields key the agent loop writes the extracted answer to
PROTOCOL_KEY = "parser_protocol"  # ... and the episode's `Protocol.key`, whose EM is the reward


def gold_answers(ground_truth: Any) -> list[str]:
    """Gold answers as a list of strings, whatever container parquet/numpy handed over."""
    if ground_truth is None:
        return []
    if isinstance(ground_truth, str):
        return [ground_truth]
    if hasattr(ground_truth, "tolist"):
        ground_truth = ground_truth.tolist()
    if isinstance(ground_truth, Iterable):
        return [str(g) for g in ground_truth]
    return [str(ground_truth)]


def score_answer(answer: str | None, ground_truth: Any, protocol: Protocol) -> float:
    """1.0 if the lead's extracted answer exactly matches a gold answer under the protocol's EM,
    else 0.0 (no answer: 0)."""
    golds = gold_answers(ground_truth)
    if not golds:
        raise ValueError("reward: no gold answers (reward_model.ground_truth is empty)")
    return protocol.exact_match(answer, golds)


def exact_match_reward(trajectory: Any, ground_truth: Any, protocol: Protocol) -> float:
    """The paper's episode reward: exact match of the trajectory's final answer."""
    return score_answer(trajectory.answer, ground_truth, protocol)


# `parser.reward` in a training config names one of these: (trajectory, ground truth, protocol) -> reward.
REWARDS: dict[str, Callable[..., float]] = {"exact_match": exact_match_reward}


def episode_reward(name: str) -> Callable[..., float]:
    if name not in REWARDS:
        raise ValueError(f"parser.reward={name!r}: unknown reward; known: {sorted(REWARDS)}")
    return REWARDS[name]


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    **_: Any,
) -> dict[str, float]:
    """verl reward-manager entry point. Returns {"score", "acc"}; "acc" is what verl's
    validation tables report."""
    if not extra_info or ANSWER_KEY not in extra_info:
        raise KeyError(
            f"parser.train.reward.compute_score: extra_info has no {ANSWER_KEY!r} (data_source={data_source!r}). "
            "The response text includes observation tokens, so it cannot be scored; run the rollout with "
            "agent_name=parser_agent (parser.methods.parser.train.ParserAgentLoop), which records the answer."
        )
    key = extra_info.get(PROTOCOL_KEY)
    protocol = protocol_for(EpisodeConfig(protocol=key) if key else EpisodeConfig())
    score = score_answer(extra_info[ANSWER_KEY], ground_truth, protocol)
    return {"score": score, "acc": score}
