"""MemAgent as a verl agent loop (parser.methods.memagent.train): one output per memory-agent call,
the final reward shared, GRPO by verl's own multi-output advantage, InfoMem on the final memory.

    .venv/bin/pytest tests/test_verl_memagent_on_cpu.py -q

The loop is Hydra-instantiated from configs/train/agent_loop.yaml as verl's rollout worker builds
it, and runs the eval baseline (`parser.methods.memagent`). The outer edge, verl's rollout server,
is `MemoryScriptServer` below: it writes the memory agent's replies (the needle's fact when the
chunk holds it, else the memory so far; then a right or a wrong \\boxed answer per trajectory),
with log-probs and prompt log-probs from a tiny real Qwen3.5 in verl's layout. The advantages
come from verl's `compute_advantage_for_multi_trajectories`, the function its v1 trainer calls.
The whole loop in verl's trainer: tests/e2e/test_verl_memagent_trainer_on_cpu.py.
"""
from __future__ import annotations

import asyncio
import re

import pytest
import torch

pytest.importorskip("verl")

from verl_fakes import ANSWER, dataset_row, prompt_logprobs_output, sequence_logprobs, train_config  # noqa: E402

from parser.train.reward import ANSWER_KEY  # noqa: E402

MEMAGENT = ["+parser.memagent.method=memagent", "+parser.memagent.chunk_size=48", "+parser.memagent.max_memory_tokens=48",
            "+parser.memagent.max_answer_tokens=24"]
WRONG = "Anna Berg"


class MemoryScriptServer:
    """verl's rollout-server contract for a memory agent whose replies are scripted."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.finals: dict[str, int] = {}  # request id -> which answer its final call gets
        self.calls: list[tuple[str, str]] = []  # (request id, "update" | "final")
        self.scored: list[list[int]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        from verl.workers.rollout.replica import TokenOutput

        if sampling_params.get("prompt_logprobs") is not None:
            self.scored.append(list(prompt_ids))
            return prompt_logprobs_output(self.model, list(prompt_ids), 3)
        text = self.tokenizer.decode(prompt_ids)
        user = text.rsplit("<|im_start|>user\n", 1)[1]
        memory = re.search(r"<memory>\n(.*?)\n</memory>", user, re.S).group(1)
        if "<section>" in user:
            self.calls.append((request_id, "update"))
            section = user.split("<section>", 1)[1]
            reply = "Zorvan was directed by Miro Tal." if "Miro Tal" in section else memory
        else:
            self.calls.append((request_id, "final"))
            index = self.finals.setdefault(request_id, len(self.finals))
            reply = f"\\boxed{{{ANSWER if index % 2 == 0 else WRONG}}}"
        ids = self.tokenizer.encode(reply, add_special_tokens=False)[: int(sampling_params["max_tokens"]) - 1] + [self.end]
        logprobs = sequence_logprobs(self.model, list(prompt_ids), ids) if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="stop",
                           extra_fields={"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3})


def run_loop(config, server, tokenizer, n: int):
    """n trajectories of one prompt (one GRPO group), as verl's rollout worker runs them."""
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    (entry,) = [e for e in OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
                if e.name == "memagent_agent"]

    async def go():
        loops = [hydra.utils.instantiate(
            config=entry, trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
            processor=None, hf_model_type=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data),
            tools=ToolListWrap([])) for _ in range(n)]
        params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
        outs = []
        for loop in loops:  # in turn, so the scripted right/wrong answers alternate by trajectory
            outs.append(await loop.run(params, **dataset_row(0)))
        return outs

    return asyncio.run(go())


@pytest.fixture(scope="module")
def group(model_dir, tiny_qwen3_5_model, tiny_tokenizer):
    config = train_config("http://127.0.0.1:9", model_dir, [*MEMAGENT, "parser.info_gain.enable=true",
                                                            "parser.info_gain.scorer=policy"])
    server = MemoryScriptServer(tiny_qwen3_5_model, tiny_tokenizer)
    return run_loop(config, server, tiny_tokenizer, n=2), server


def test_each_memory_update_is_an_output_and_the_reward_is_shared(group, tiny_tokenizer):
    outputs, server = group
    right, wrong = outputs
    assert len(right) == len(wrong) > 2  # chunks + 1 conversations
    updates = [c for c in server.calls if c[1] == "update"]
    assert len(updates) == 2 * (len(right) - 1)
    for trajectory, reward in ((right, 1.0), (wrong, 0.0)):
        assert all(o.reward_score == reward for o in trajectory)
        for o in trajectory:  # a memory agent's response is all its own: mask 1, a log-prob per token
            assert o.response_mask == [1] * len(o.response_ids) and len(o.response_logprobs) == len(o.response_ids)
            assert o.extra_fields["min_global_steps"] == o.extra_fields["max_global_steps"] == 3
        final = trajectory[-1]
        assert "Your answer:" in tiny_tokenizer.decode(final.prompt_ids)
        assert final.extra_fields["reward_extra_info"] == {"acc": reward}
    assert right[-1].extra_fields[ANSWER_KEY] == ANSWER and wrong[-1].extra_fields[ANSWER_KEY] == WRONG
    # the memory written after the needle's chunk is carried into every later prompt
    needle_at = next(i for i, o in enumerate(right) if "Miro Tal" in tiny_tokenizer.decode(o.response_ids))
    assert all("Zorvan was directed by Miro Tal." in tiny_tokenizer.decode(o.prompt_ids) for o in right[needle_at + 1:])


def test_infomem_scores_the_final_memory_of_a_successful_read(group, tiny_qwen3_5_model, tiny_tokenizer):
    outputs, server = group
    right, wrong = outputs
    record = right[-1].extra_fields["info_gain"]
    assert record["scorer"] == "policy" and record["error"] is None
    assert wrong[-1].extra_fields["info_gain"]["error"] == "not a successful trajectory"
    assert len(server.scored) == 2  # with and without the memory, for the one success
    answer = tiny_tokenizer.encode(ANSWER, add_special_tokens=False)
    (with_memory,) = [p for p in server.scored if "Findings gathered" in tiny_tokenizer.decode(p)]
    assert "Zorvan was directed by Miro Tal." in tiny_tokenizer.decode(with_memory)
    (without,) = [p for p in server.scored if p is not with_memory]
    mean = [sum(v) / len(v) for v in (sequence_logprobs(tiny_qwen3_5_model, p[: -len(answer)], answer) for p in (with_memory, without))]
    assert record["gain"] == pytest.approx(mean[0] - mean[1], abs=1e-4)


def test_verls_multi_output_advantage_trains_every_conversation_with_its_sessions_advantage(group):
    """What verl's v1 trainer does with these outputs: keys {uid}_{session}_{index}, GRPO over the
    sessions' last outputs, the advantage broadcast to each of a session's conversations."""
    import numpy as np
    from verl.protocol import DataProto
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    outputs, _ = group
    rows = [(f"u0_{s}_{i}", o.as_dict()) for s, trajectory in enumerate(outputs) for i, o in enumerate(trajectory)]
    width = max(r["responses"].numel() for _, r in rows)

    def pad(t):
        return torch.nn.functional.pad(t, (0, width - t.numel()))

    data = DataProto.from_dict(
        tensors={"token_level_rewards": torch.stack([pad(r["rm_scores"]) for _, r in rows]),
                 "response_mask": torch.stack([pad(r["response_mask"]) for _, r in rows])},
        non_tensors={"uid": np.array(["u0"] * len(rows), dtype=object)})
    out = compute_advantage_for_multi_trajectories(data, batch_keys=[k for k, _ in rows], adv_estimator=AdvantageEstimator.GRPO,
                                                   num_repeat=2, norm_adv_by_std_in_grpo=True)
    for (key, _), adv, mask in zip(rows, out.batch["advantages"], out.batch["response_mask"], strict=True):
        values = set(adv[mask.bool()].tolist())
        assert len(values) == 1, key  # one advantage over the whole conversation
        (value,) = values
        assert value == pytest.approx(0.7071, abs=1e-3) if key.startswith("u0_0_") else value == pytest.approx(-0.7071, abs=1e-3)


def test_infomem_needs_the_policy_scorer_for_a_memory_agent(model_dir, tiny_qwen3_5_model, tiny_tokenizer):
    config = train_config("http://127.0.0.1:9", model_dir, [*MEMAGENT, "parser.info_gain.enable=true"])
    from hydra.errors import InstantiationException

    with pytest.raises(InstantiationException, match="no subagent model"):  # Hydra wraps the loop's ValueError
        run_loop(config, MemoryScriptServer(tiny_qwen3_5_model, tiny_tokenizer), tiny_tokenizer, n=1)
