"""InfoMem inside verl's trainer (parser.train.infomem.group): the gain scored in verl's own rollout
worker by the policy, the group step that composes the rewards, and its step metrics.

    .venv/bin/pytest tests/test_verl_info_gain_on_cpu.py -q

The agent loop runs inside verl's `AgentLoopWorker` built from the shipped config (as in
tests/test_verl_agent_loop_on_cpu.py): a scripted tiny Qwen3.5 lead answers right in one
trajectory of each group and wrong in the other, the subagents are the loopback HTTP worker, and
the policy scorer's `prompt_logprobs` requests are answered by the same tiny model, in verl's
layout (tests/verl_fakes.py, standing in for verl's SGLang server). The group composition is
checked on verl's key layout by hand; the whole loop (TransferQueue writes, dynamic sampling,
GRPO on the composed reward) runs in tests/e2e/test_verl_trainer_on_cpu.py.
"""
from __future__ import annotations

import math

import pytest

pytest.importorskip("verl")

from verl_fakes import (QUESTIONS, SCRIPT, WRONG_SCRIPT, ScriptedServerManager, dataset_row, run_verl_worker,  # noqa: E402
                        sequence_logprobs, train_config)

from parser.train.infomem.gain import SCORING_FAILED, InfoGainConfig  # noqa: E402
from parser.train.infomem.group import compose_groups, final_outputs, info_gain_metrics  # noqa: E402


def run_groups(needle_loopback, model_dir, model, tokenizer, overrides):
    config = train_config(needle_loopback.url, model_dir, ["parser.info_gain.enable=true", *overrides])
    manager = ScriptedServerManager(model, tokenizer, scripts=[SCRIPT, WRONG_SCRIPT])
    rows = [dataset_row(i // 2, QUESTIONS[i // 2]) for i in range(4)]
    return run_verl_worker(config, manager, rows), manager, config


def test_policy_scores_only_successful_trajectories_and_the_reward_stays_em(needle_loopback, model_dir, tiny_qwen3_5_model,
                                                                             tiny_tokenizer):
    out, manager, _ = run_groups(needle_loopback, model_dir, tiny_qwen3_5_model, tiny_tokenizer, ["parser.info_gain.scorer=policy"])
    records, accs = list(out.non_tensor_batch["info_gain"]), list(out.non_tensor_batch["acc"])
    assert sorted(accs) == [0.0, 0.0, 1.0, 1.0]
    assert out.batch["rm_scores"].sum(-1).tolist() == accs  # composition happens later, per group
    answer = tiny_tokenizer.encode("Miro Tal", add_special_tokens=False)
    assert all(p[-len(answer):] == answer for p in manager.scored)  # the gold answer is what is scored
    prompts = {tiny_tokenizer.decode(p[: -len(answer)]): p[: -len(answer)] for p in manager.scored}
    for record, acc, question in zip(records, accs, [QUESTIONS[i // 2] for i in range(4)], strict=True):
        assert record["scorer"] == "policy" and record["prompt_version"] == "v1"
        if acc < 1:
            assert record["gain"] is None and record["error"] == "not a successful trajectory"
            continue
        assert record["error"] is None and record["evidence_tokens"] > 0
        # recompute by hand from the two prompts the policy was sent for this question
        (with_text,) = [t for t in prompts if f"Question: {question}" in t and "Findings gathered" in t]
        (without_text,) = [t for t in prompts if f"Question: {question}" in t and "Findings gathered" not in t]
        assert "directed by Miro Tal" in with_text  # the loopback subagent's finding, quoted
        mean = {name: sum(lp) / len(lp) for name, lp in
                (("with", sequence_logprobs(tiny_qwen3_5_model, prompts[with_text], answer)),
                 ("without", sequence_logprobs(tiny_qwen3_5_model, prompts[without_text], answer)))}
        assert record["lp_with"] == pytest.approx(mean["with"], abs=1e-4)
        assert record["gain"] == pytest.approx(mean["with"] - mean["without"], abs=1e-4)
    assert len(manager.scored) == 2 * accs.count(1.0)  # two scoring requests per success, none for failures


def test_a_scorer_that_cannot_score_is_recorded_and_never_fatal(needle_loopback, model_dir, tiny_qwen3_5_model, tiny_tokenizer):
    """The subagent scorer here is the loopback worker, which returns no input logprobs."""
    out, _, _ = run_groups(needle_loopback, model_dir, tiny_qwen3_5_model, tiny_tokenizer,
                           ["parser.info_gain.scorer=subagent", "parser.episode.max_attempts=2", "parser.episode.retry_backoff_s=0.01"])
    records, accs = list(out.non_tensor_batch["info_gain"]), list(out.non_tensor_batch["acc"])
    assert sorted(accs) == [0.0, 0.0, 1.0, 1.0]
    for record, acc in zip(records, accs, strict=True):
        assert record["gain"] is None and record["scorer"] == "subagent"
        assert record["error"].startswith(SCORING_FAILED) if acc == 1.0 else record["error"] == "not a successful trajectory"


# ---------------------------------------------------------------------- the group step on verl's keys
def _row(acc, gain=None, error=None):
    return {"reward_extra_info": {"acc": acc}, "info_gain": {"gain": gain, "error": error}}


def test_groups_are_composed_from_em_and_gain_by_uid():
    keys = ["u1_0_0", "u1_1_0", "u1_2_0", "u1_3_0", "u2_0_0", "u2_1_0", "u3_0_0", "u3_1_0"]
    rows = [_row(1.0, 0.2), _row(1.0, 0.8), _row(0.0), _row(1.0, 0.5),  # u1: three successes
            _row(1.0, 2.0), _row(0.0),                                   # u2: a group of one success
            _row(1.0, 0.3), _row(1.0, 0.3)]                              # u3: all-equal gains
    got = compose_groups(keys, rows, InfoGainConfig(enable=True))
    z = math.sqrt(1.5)
    assert got == pytest.approx([1 - 0.2 * z, 1 + 0.2 * z, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0])


def test_every_output_of_a_multi_output_trajectory_gets_its_last_outputs_reward():
    """verl keys a trajectory's outputs {uid}_{session}_{index}; its final output carries the
    gain (a MemAgent-style loop returns one output per conversation)."""
    keys = ["u1_0_0", "u1_0_1", "u1_0_2", "u1_1_0", "u1_1_1"]
    rows = [_row(1.0), _row(1.0), _row(1.0, 1.0), _row(1.0), _row(1.0, 3.0)]  # earlier outputs: EM copied, no gain
    assert final_outputs(keys) == {"u1": {"u1_0": 2, "u1_1": 4}}
    got = compose_groups(keys, rows, InfoGainConfig(enable=True))
    assert got == pytest.approx([0.8, 0.8, 0.8, 1.2, 1.2])


def test_composition_is_idempotent_and_skips_rows_without_em():
    keys, rows = ["u1_0_0", "u1_1_0", "u1_2_0"], [_row(1.0, 0.1), _row(1.0, 0.9), {"unrelated": True}]
    config = InfoGainConfig(enable=True, normalization="center", beta=0.5)
    assert compose_groups(keys, rows, config) == compose_groups(keys, rows, config) == pytest.approx([0.8, 1.2, None])


def test_step_metrics_gain_spread_and_changed_groups():
    keys = ["u1_0_0", "u1_1_0", "u2_0_0", "u2_1_0", "u3_0_0", "u3_1_0"]
    rows = [_row(1.0, 0.2), _row(1.0, 0.6), _row(1.0, 0.4), _row(0.0),
            _row(1.0, None, f"{SCORING_FAILED}: BackendError: down"), _row(0.0)]
    scores = compose_groups(keys, rows, InfoGainConfig(enable=True))
    metrics = info_gain_metrics(keys, rows, scores)
    assert metrics["parser/info_gain/groups_changed"] == pytest.approx(1 / 3)  # only u1 has two gains to rank
    assert metrics["parser/info_gain/gain/mean"] == pytest.approx(0.4)
    assert metrics["parser/info_gain/gain/std"] == pytest.approx(math.sqrt(((0.2) ** 2 + 0 + (0.2) ** 2) / 3))
    assert metrics["parser/info_gain/scored_fraction"] == pytest.approx(3 / 4)
    assert metrics["parser/info_gain/bonus_abs/mean"] == pytest.approx(0.2 * 2 / 4)
    assert metrics["parser/info_gain/failures/sum"] == 1.0
    padded = info_gain_metrics(keys, rows, scores, tags=[{}, {}, {"is_padding": True}, {"is_padding": True}, {}, {}])
    assert padded["parser/info_gain/groups_changed"] == pytest.approx(1 / 2)
    assert info_gain_metrics([], [], []) == {}


def test_trajectories_generated_without_infomem_are_counted_apart():
    """A run resumed with InfoMem on first samples groups its earlier launch generated (verl keeps
    the replay buffer in the checkpoint): they carry no record, are trained on EM and are counted
    as unrecorded, not as successes that failed to score."""
    keys = ["u1_0_0", "u1_1_0", "u2_0_0", "u2_1_0"]
    rows = [_row(1.0, 0.3), _row(0.0), {"reward_extra_info": {"acc": 1.0}}, {"reward_extra_info": {"acc": 0.0}}]
    scores = compose_groups(keys, rows, InfoGainConfig(enable=True))
    assert scores[2:] == [1.0, 0.0]  # EM as it was
    metrics = info_gain_metrics(keys, rows, scores)
    assert metrics["parser/info_gain/unrecorded/sum"] == 2.0
    assert metrics["parser/info_gain/scored_fraction"] == 1.0
    only_old = info_gain_metrics(keys[2:], rows[2:], scores[2:])
    assert only_old["parser/info_gain/unrecorded/sum"] == 2.0 and "parser/info_gain/scored_fraction" not in only_old


def test_the_replay_buffer_reads_the_settings_verl_hands_it(needle_loopback, model_dir):
    from parser.train.sampler import ParserReplayBuffer

    config = train_config(needle_loopback.url, model_dir, ["parser.info_gain.enable=true", "parser.info_gain.beta=0.3",
                                                     "algorithm.filter_groups.metric=acc"])
    buffer = ParserReplayBuffer(
        trainer_mode="separate_async", trainer_config=config.trainer.v1.separate_async,
        max_off_policy_threshold=2, max_off_policy_strategy="drop", refill_fn=lambda n: None,
        sampler_kwargs=config.trainer.v1.sampler.sampler_kwargs,
    )
    assert buffer.info_gain == InfoGainConfig(enable=True, beta=0.3)
    assert buffer.filter_groups_metric == "acc"  # dynamic sampling judges groups by their EM


def test_a_stored_gain_that_is_not_a_usable_number_is_no_gain_and_the_group_stays_finite():
    """Records read back from TransferQueue are data: NaN, inf, huge or a string gain is no gain."""
    keys = [f"u1_{i}_0" for i in range(6)]
    rows = [_row(1.0, float("nan")), _row(1.0, float("inf")), _row(1.0, 1e308), _row(1.0, "0.5"),
            _row(1.0, 0.2), _row(1.0, 0.8)]
    got = compose_groups(keys, rows, InfoGainConfig(enable=True))
    assert got == pytest.approx([1.0, 1.0, 1.0, 1.0, 0.8, 1.2])
    metrics = info_gain_metrics(keys, rows, got)
    assert all(math.isfinite(v) for v in metrics.values()) and metrics["parser/info_gain/scored_fraction"] == 2 / 6
