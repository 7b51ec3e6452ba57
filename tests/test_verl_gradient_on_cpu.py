"""Observation tokens get exactly zero gradient through verl's GRPO loss; lead tokens do not.

    .venv/bin/pytest tests/test_verl_gradient_on_cpu.py -q

The batch is what verl's rollout worker produced from real ParSer episodes (scripted lead on a
tiny Qwen3.5, subagents over loopback HTTP; see tests/verl_fakes.py): two questions x two
trajectories, one right and one wrong per group, so GRPO advantages are non-zero. The loss is
verl's own actor loss, `verl.workers.utils.losses.ppo_loss` (vanilla clipped PPO + low-var KL,
`seq-mean-token-mean`), fed the model's per-token log-probs in verl's no-padding layout, with
advantages from verl's `compute_grpo_outcome_advantage` and the Table 9 actor config.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from verl_fakes import ANSWER, NEEDLE, SCRIPT, WRONG_SCRIPT, ScriptedServerManager, dataset_row, run_verl_worker, save_tiny_model, train_config  # noqa: E402

from parser.serving.loopback import start_loopback  # noqa: E402


@pytest.fixture(scope="module")
def rollout(tiny_qwen3_5_model, tiny_tokenizer, tmp_path_factory):
    model_dir = save_tiny_model(tiny_qwen3_5_model, tiny_tokenizer, str(tmp_path_factory.mktemp("tiny-lead")))
    with start_loopback("subagent-w1", needle=NEEDLE, needle_answer=ANSWER) as loopback:
        config = train_config(loopback.url, model_dir)
        manager = ScriptedServerManager(tiny_qwen3_5_model, tiny_tokenizer, scripts=[SCRIPT, WRONG_SCRIPT])
        questions = ["Who directed the film Zorvan?", "Which person directed Zorvan?"]
        out = run_verl_worker(config, manager, [dataset_row(i // 2, questions[i // 2]) for i in range(4)])
    return out, config


def actor_log_probs(model, batch) -> torch.Tensor:
    """Per-token log-probs over the unpadded sequences, concatenated: verl's no-padding layout
    (position j holds log p(token j+1 | tokens <= j))."""
    from verl.utils.torch_functional import logprobs_from_logits

    flat = []
    for ids, attention in zip(batch["input_ids"], batch["attention_mask"], strict=True):
        ids = ids[attention.bool()]
        logits = model(input_ids=ids[None]).logits[0].float()
        flat.append(logprobs_from_logits(logits, torch.roll(ids, -1)))
    return torch.cat(flat)


def verl_loss(actor_config, log_probs: torch.Tensor, batch, response_mask: torch.Tensor) -> torch.Tensor:
    from tensordict import TensorDict
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    advantages, _ = compute_grpo_outcome_advantage(batch["rm_scores"], response_mask, index=batch["uid"])
    old = batch["rollout_log_probs"]  # off-policy by rollout noise only: same weights
    ref = old + 0.01 * torch.arange(old.shape[1]).remainder(3)[None]  # a reference that differs a little
    data = TensorDict(
        {
            "prompts": batch["prompts"], "responses": batch["responses"], "attention_mask": batch["attention_mask"],
            "response_mask": response_mask, "old_log_probs": old, "advantages": advantages, "ref_log_prob": ref,
        },
        batch_size=[len(old)],
    )
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(response_mask.sum()), global_batch_size=len(old))
    loss, _ = ppo_loss(actor_config, {"log_probs": log_probs}, data)
    return loss


@pytest.fixture(scope="module")
def setup(rollout, tiny_tokenizer):
    from verl.utils.config import omega_conf_to_dataclass

    from parser.offline import tiny_qwen3_5

    out, config = rollout
    actor_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert actor_config.loss_agg_mode == "seq-mean-token-mean" and actor_config.use_kl_loss
    batch = {k: out.batch[k] for k in ("prompts", "responses", "attention_mask", "input_ids", "response_mask",
                                       "rollout_log_probs", "rm_scores")}
    batch["uid"] = np.array([info["index"] for info in out.non_tensor_batch["extra_info"]])
    assert sorted(out.batch["rm_scores"].sum(-1).tolist()) == [0.0, 0.0, 1.0, 1.0]
    model = tiny_qwen3_5(tiny_tokenizer)  # same seed: the weights the rollout used, trainable copy
    return model, actor_config, batch


def response_grads(model, actor_config, batch, response_mask):
    from verl.workers.utils.padding import no_padding_2_padding

    model.zero_grad()
    log_probs = actor_log_probs(model, batch)
    log_probs.retain_grad()
    loss = verl_loss(actor_config, log_probs, batch, response_mask)
    loss.backward()
    padded = no_padding_2_padding(log_probs.grad, {"prompts": batch["prompts"], "responses": batch["responses"],
                                                   "attention_mask": batch["attention_mask"]})
    params = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), log_probs.grad, padded, params


def test_observation_tokens_get_exactly_zero_gradient(setup):
    model, actor_config, batch = setup
    mask = batch["response_mask"]
    loss, flat_grad, grad, params = response_grads(model, actor_config, batch, mask)
    valid = batch["attention_mask"][:, batch["prompts"].shape[1]:].bool()
    observation = valid & ~mask.bool()
    assert observation.sum() > 20 and mask.sum() > 20
    assert (grad[observation] == 0).all()  # exactly zero, not small
    assert (grad[mask.bool()] != 0).all()  # every lead token is trained
    # nothing outside the lead tokens: prompt, observation and padding positions are all 0
    assert int((flat_grad != 0).sum()) == int(mask.sum())
    assert any(g.abs().sum() > 0 for g in params.values())


def test_parameter_gradients_do_not_depend_on_observation_log_probs(setup):
    """Cutting the graph at every observation position leaves loss and parameter gradients
    bit-identical: observation tokens contribute nothing to the update."""
    model, actor_config, batch = setup
    mask = batch["response_mask"]
    loss_a, _, _, params_a = response_grads(model, actor_config, batch, mask)

    from verl.workers.utils.padding import no_padding_2_padding

    model.zero_grad()
    log_probs = actor_log_probs(model, batch)
    lead = no_padding_2_padding(torch.arange(len(log_probs), dtype=torch.float), {
        "prompts": batch["prompts"], "responses": batch["responses"], "attention_mask": batch["attention_mask"]})
    keep = torch.zeros(len(log_probs), dtype=torch.bool)
    keep[lead[mask.bool()].long()] = True
    cut = torch.where(keep, log_probs, log_probs.detach())
    loss_b = verl_loss(actor_config, cut, batch, mask)
    loss_b.backward()
    assert torch.equal(loss_a, loss_b.detach())
    for name, p in model.named_parameters():
        if name in params_a:
            assert torch.equal(params_a[name], p.grad), name


def test_a_wrong_mask_would_train_observations(setup):
    """The check above can fail: with every response token marked trainable, observation
    positions receive gradient."""
    model, actor_config, batch = setup
    valid = batch["attention_mask"][:, batch["prompts"].shape[1]:]
    _, _, grad, _ = response_grads(model, actor_config, batch, valid)
    observation = valid.bool() & ~batch["response_mask"].bool()
    assert (grad[observation] != 0).any()


def test_rollout_actor_gap_is_tiny_with_equal_weights(setup):
    """verl's off-policy metric (the paper's |log-ppl difference|) on this batch: rollout and
    actor use the same weights, so the gap is float noise only."""
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics
    from verl.workers.utils.padding import no_padding_2_padding

    model, _, batch = setup
    with torch.no_grad():
        actor = no_padding_2_padding(actor_log_probs(model, batch), {
            "prompts": batch["prompts"], "responses": batch["responses"], "attention_mask": batch["attention_mask"]})
    metrics = compute_offpolicy_metrics(actor, batch["rollout_log_probs"], batch["response_mask"])
    assert 0 <= metrics["log_ppl_abs_diff"] < 1e-4


def test_a_rewarded_trajectory_gets_a_positive_advantage_on_every_lead_token(setup):
    """The sign that makes GRPO learn: verl's advantages from our reward placement (rm_scores on
    the last response token) are > 0 on each lead token of the right trajectory and < 0 on the
    wrong one's, and the loss's gradient raises the right trajectory's log-probs."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    model, actor_config, batch = setup
    mask = batch["response_mask"].bool()
    advantages, _ = compute_grpo_outcome_advantage(batch["rm_scores"], batch["response_mask"], index=batch["uid"])
    rewards = batch["rm_scores"].sum(-1)
    for row in range(len(rewards)):
        lead = advantages[row][mask[row]]
        assert lead.numel() > 0
        assert bool((lead > 0).all()) if rewards[row] > 0 else bool((lead < 0).all()), row
    _, _, padded, _ = response_grads(model, actor_config, batch, batch["response_mask"])
    # gradient descent on the loss moves a log-prob against its gradient: up for the rewarded rows
    for row in range(len(rewards)):
        direction = -padded[row][mask[row]]
        assert bool((direction > 0).all()) if rewards[row] > 0 else bool((direction < 0).all()), row
