"""Guards that turn a trainer running without learning into a red test (the replay buffer's side).

    .venv/bin/pytest tests/test_verl_learning_guards_on_cpu.py -q

`parser.train.sampler.ParserReplayBuffer` is verl 0.9.1's async replay buffer plus per-step
metrics; here its eviction bookkeeping is driven with verl's own code and a faked TransferQueue
snapshot (the outer edge: the store verl keeps trajectories in). The end-to-end counterparts run
in tests/e2e/test_verl_trainer_on_cpu.py.
"""
from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("verl")

from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync  # noqa: E402

from parser.train.sampler import ParserReplayBuffer, staleness_metrics, version_metrics  # noqa: E402


def buffer(bound: int, refills: list[int]) -> ParserReplayBuffer:
    return ParserReplayBuffer(
        trainer_mode="separate_async", trainer_config={}, max_off_policy_threshold=2, max_off_policy_strategy="drop",
        refill_fn=refills.append, sampler_kwargs={"dynamic_sampling": True, "filter_groups_metric": "reward",
                                                  "max_filtered_groups_per_step": bound},
    )


def test_dynamic_sampling_regenerates_at_most_the_bound_per_step(monkeypatch):
    """verl evicts and regenerates every uniform-reward group with no limit; a policy that solves
    every prompt then stalls the trainer forever (the CPU smoke run's 13-minute hang). Past the
    bound, uniform groups stay sampleable, and the next step gets a fresh budget."""
    refills: list[int] = []
    rb = buffer(bound=3, refills=refills)
    state = {"uniform": {"a", "b", "c", "d", "e"}}

    def reasons(self, global_steps, partition_id):  # verl's classification: these groups are all-1.0
        self._dapo_classification_cache[partition_id].update({u: 1.0 for u in state["uniform"]})
        return set(), set(state["uniform"]), set(), Counter({1.0: len(state["uniform"])})

    def evict(self, global_steps, partition_id, eviction_reasons):
        stale, uniform, failed, _ = eviction_reasons
        state["uniform"] -= uniform
        return uniform, len(stale), len(uniform), {}

    monkeypatch.setattr(ReplayBufferAsync, "_terminal_eviction_reasons", reasons)
    monkeypatch.setattr(ReplayBufferAsync, "_evict_terminal_groups", evict)
    first = rb._terminal_eviction_reasons(5, "train")
    assert len(first[1]) == 3 and first[3] == Counter({1.0: 3})
    rb._evict_terminal_groups(5, "train", first)
    state["uniform"] |= {"f", "g"}  # their replacements came back uniform too
    assert rb._terminal_eviction_reasons(5, "train")[1] == set()  # budget spent: sampled as they are
    assert rb._terminal_eviction_reasons(6, "train")[1] == set(sorted(state["uniform"])[:3])  # a new step


def test_an_unbounded_sampler_is_refused():
    with pytest.raises(ValueError, match="max_filtered_groups_per_step"):
        ParserReplayBuffer(trainer_mode="separate_async", trainer_config={}, max_off_policy_threshold=2,
                           max_off_policy_strategy="drop", refill_fn=lambda n: None,
                           sampler_kwargs={"dynamic_sampling": True})


def test_staleness_drop_fraction_is_logged_every_step():
    assert staleness_metrics({}, 8) == {"parser/staleness/dropped_groups/sum": 0.0,
                                        "parser/staleness/dropped_fraction": 0.0}
    evicted = {"training/off_policy/evicted_samples": 6, "training/filter_groups/evicted_samples": 2}
    assert staleness_metrics(evicted, 8) == {"parser/staleness/dropped_groups/sum": 6.0,
                                             "parser/staleness/dropped_fraction": 6 / 16}


def test_weight_versions_of_sampled_trajectories_are_logged():
    tags = [{"min_global_steps": 3, "max_global_steps": 4}, {"min_global_steps": 4, "max_global_steps": 4},
            {"min_global_steps": None, "max_global_steps": None}, {"is_padding": True}]
    assert version_metrics(tags) == {"parser/weights/unversioned/sum": 1.0, "parser/weights/oldest_version/min": 3.0,
                                     "parser/weights/newest_version/max": 4.0}
