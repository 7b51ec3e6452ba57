"""The ParSer agent loop inside verl 0.9.1's own rollout worker, on CPU, no Ray, no GPU.

    .venv/bin/pytest tests/test_verl_agent_loop_on_cpu.py -q

verl's `AgentLoopWorker` is built from the shipped 4B config (shrunk to a tiny model), so our
loop is Hydra-instantiated from configs/train/agent_loop.yaml exactly as on a cluster; the lead
is a tiny real Qwen3.5 model in process behind the server-manager contract (tests/verl_fakes.py),
the subagents are real loopback HTTP servers, and the result goes through verl's own
post-processing (`_agent_loop_postprocess`, `_postprocess`) and reward-manager code.
"""
from __future__ import annotations

import asyncio
import itertools

import pytest
import torch

pytest.importorskip("verl")

from verl_fakes import (  # noqa: E402
    ANSWER,
    NEEDLE,
    QUESTIONS,
    SCRIPT,
    WRONG_SCRIPT,
    ScriptedServerManager,
    TinyModelServerManager,
    dataset_row,
    run_verl_worker,
    train_config,
)

from parser.train.metrics import step_metrics  # noqa: E402
from parser.train.reward import ANSWER_KEY, compute_score  # noqa: E402


@pytest.fixture(scope="module")
def scripted(needle_loopback, model_dir, tiny_qwen3_5_model, tiny_tokenizer):
    """Two prompts x two trajectories (one right, one wrong answer per group), through verl."""
    needle_loopback.worker.records.clear()
    config = train_config(needle_loopback.url, model_dir)
    manager = ScriptedServerManager(tiny_qwen3_5_model, tiny_tokenizer, scripts=[SCRIPT, WRONG_SCRIPT])
    rows = [dataset_row(i // 2, QUESTIONS[i // 2]) for i in range(4)]
    out = run_verl_worker(config, manager, rows)
    return out, manager, list(needle_loopback.worker.records), config


def _trajectories(out, manager):
    """Per output row, the request id of the trajectory it came from: the one whose last lead
    prompt plus its scripted generation is exactly the row's token stream (siblings in a group
    share their first turn, so only the whole stream tells them apart)."""
    calls: dict[str, list] = {}
    for req in manager.requests:
        calls.setdefault(req.request_id, []).append(req)
    ids = []
    for i in range(len(out)):
        stream = out.batch["input_ids"][i][out.batch["attention_mask"][i].bool()].tolist()
        (match,) = [rid for rid, cs in calls.items()
                    if cs[-1].prompt_ids + manager.script_ids(rid, len(cs) - 1, cs[0].prompt_ids)[0] == stream]
        ids.append(match)
    assert len(set(ids)) == len(out)
    return ids


def test_rewards_answers_and_score_position(scripted):
    out, manager, _, _ = scripted
    answers = list(out.non_tensor_batch[ANSWER_KEY])
    assert sorted(answers) == sorted([ANSWER, "Anna Berg"] * 2)
    scores = out.batch["rm_scores"]
    response_len = out.batch["attention_mask"][:, out.batch["prompts"].shape[1]:].sum(-1)
    for i, answer in enumerate(answers):
        expected = 1.0 if answer == ANSWER else 0.0
        assert scores[i].sum().item() == expected
        assert scores[i, response_len[i] - 1].item() == expected  # verl puts it on the last token
        assert out.non_tensor_batch["acc"][i] == expected


def test_mask_is_one_exactly_on_lead_generated_tokens(scripted, tiny_tokenizer):
    out, manager, _, _ = scripted
    ids = dict(zip(range(len(out)), _trajectories(out, manager), strict=True))
    for i, request_id in ids.items():
        calls = [r for r in manager.requests if r.request_id == request_id]
        assert len(calls) == 2  # one request id for the whole trajectory (sticky session)
        generated = [manager.script_ids(request_id, t, calls[0].prompt_ids)[0] for t in range(2)]
        mask = out.batch["response_mask"][i]
        responses = out.batch["responses"][i]
        valid = out.batch["attention_mask"][i, out.batch["prompts"].shape[1]:].bool()
        assert responses[mask.bool()].tolist() == generated[0] + generated[1]
        # the only 0-mask tokens inside the response are the observation between the two turns
        n0, n1 = len(generated[0]), len(generated[1])
        assert mask[valid].tolist() == [1] * n0 + [0] * (int(valid.sum()) - n0 - n1) + [1] * n1
        observation = tiny_tokenizer.decode(responses[valid][n0:-n1].tolist())
        assert "tool" in observation and ANSWER in observation  # the finding reached the lead
        assert NEEDLE not in tiny_tokenizer.decode(out.batch["prompts"][i].tolist())  # never the chunk in the prompt
        # append-only: turn 2's prompt is exactly prompt + turn 1 + observation
        prompt = out.batch["prompts"][i][out.batch["attention_mask"][i, : out.batch["prompts"].shape[1]].bool()]
        assert calls[1].prompt_ids == prompt.tolist() + responses[valid][: int(valid.sum()) - n1].tolist()
        assert not mask[~valid].any()


def test_rollout_logprobs_sit_on_lead_tokens(scripted, tiny_qwen3_5_model):
    from verl_fakes import sequence_logprobs

    out, manager, _, _ = scripted
    for i, request_id in enumerate(_trajectories(out, manager)):
        calls = [r for r in manager.requests if r.request_id == request_id]
        mask = out.batch["response_mask"][i].bool()
        logprobs = out.batch["rollout_log_probs"][i]
        expected = list(itertools.chain.from_iterable(
            sequence_logprobs(tiny_qwen3_5_model, c.prompt_ids, manager.script_ids(request_id, t, calls[0].prompt_ids)[0])
            for t, c in enumerate(calls)))
        assert torch.allclose(logprobs[mask], torch.tensor(expected), atol=1e-6)
        assert (logprobs[~mask] == 0).all()


def test_verl_sampling_policy_and_turn_budget_reach_the_server(scripted):
    out, manager, _, config = scripted
    rollout = config.actor_rollout_ref.rollout
    for req in manager.requests:
        params = req.sampling_params
        assert (params["temperature"], params["top_p"], params["top_k"]) == (rollout.temperature, rollout.top_p, rollout.top_k)
        assert params["logprobs"] is True
    # per-turn budget: min(2048, what is left of rollout.response_length=2048), never verl's default
    first, second = manager.requests[0], [r for r in manager.requests if r.request_id == manager.requests[0].request_id][1]
    assert first.sampling_params["max_tokens"] == 2048
    assert second.sampling_params["max_tokens"] == 2048 - (len(second.prompt_ids) - len(first.prompt_ids))
    assert len({r.request_id for r in manager.requests}) == len(out) == 4


def test_lead_stops_at_its_end_of_turn_tokens(scripted, tiny_tokenizer):
    """SGLang under verl skips its tokenizer: the stop ids must travel with every lead request."""
    _, manager, _, _ = scripted
    ends = [tiny_tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    assert manager.requests and all(r.sampling_params["stop_token_ids"] == ends for r in manager.requests)


def test_weight_versions_reach_verls_trajectory_fields(scripted):
    """verl's trainer casts each trajectory's min/max_global_steps to int (trainer_base.py); a
    two-turn episode served by versions 7 then 8 must report 7 and 8, per trajectory."""
    out, manager, _, _ = scripted
    assert list(out.non_tensor_batch["min_global_steps"]) == [7] * 4
    assert list(out.non_tensor_batch["max_global_steps"]) == [8] * 4
    assert all(int(v) == v for v in out.non_tensor_batch["max_global_steps"])


def test_adapter_pools_versions_per_request_and_forgets_them():
    from verl.workers.rollout.replica import TokenOutput

    from parser.serving.types import SamplingParams
    from parser.train.server_manager import ServerManagerBackend

    class Versions:  # the server manager's contract; versions as verl's clients report them
        def __init__(self):
            self.extras = [{"global_steps": 3}, {"global_steps": 5, "min_global_steps": 4, "max_global_steps": 5}, {}]

        async def generate(self, request_id, *, prompt_ids, sampling_params):
            return TokenOutput(token_ids=[1], extra_fields=self.extras.pop(0))

    backend = ServerManagerBackend(Versions(), {"temperature": 1.0})

    async def run():
        for request_id in ("a", "a", "b"):
            await backend.generate([1, 2], SamplingParams(max_new_tokens=4), request_id=request_id)

    asyncio.run(run())
    assert backend.take_weight_versions("a") == {"min_global_steps": 3, "max_global_steps": 5}
    assert backend.take_weight_versions("b") == {"min_global_steps": None, "max_global_steps": None}
    assert backend.versions == {}


def test_subagents_answer_over_http_with_chunk_routing_keys(scripted):
    out, _, records, _ = scripted
    stats = list(out.non_tensor_batch["parser_stats"])
    chunks = int(stats[0]["subagent_calls"])  # one query per trajectory
    assert chunks > 1 and len(records) == 4 * chunks
    keys = {r.routing_key for r in records}
    assert keys == {f"doc-{d}:{c}" for d in (0, 1) for c in range(chunks)}
    assert all(r.path == "/generate" for r in records)


def test_step_metrics_from_the_batch(scripted):
    out, _, _, _ = scripted
    metrics = step_metrics(list(out.non_tensor_batch["parser_stats"]), list(out.non_tensor_batch["acc"]))
    assert metrics["parser/turns/mean"] == 2 and metrics["parser/queries_per_turn"] == 0.5
    assert metrics["parser/replies_per_query"] == 1.0  # only the needle's chunk answers
    assert metrics["parser/invalid_action_rate"] == 0 and metrics["parser/subagent_failures/sum"] == 0
    assert metrics["parser/reward/mean"] == 0.5 and metrics["parser/answered"] == 1.0
    assert metrics["parser/lead_tokens_per_turn"] > 0


def test_reward_manager_path_scores_the_answer_not_the_observation(scripted, tiny_tokenizer):
    """verl's naive reward manager with our compute_score, fed the way verl's agent loop feeds
    it (extra_fields as `tool_extra_fields`). The decoded response quotes the subagents' finding
    ("Miro Tal") even in the wrong trajectory; only the extracted answer decides."""
    import numpy as np
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

    out, _, _, config = scripted

    async def score_all() -> list[float]:
        manager = NaiveRewardManager(config, tiny_tokenizer, compute_score)  # binds the running loop
        scores = []
        for i in range(len(out)):
            item = out[i : i + 1]
            item.non_tensor_batch["tool_extra_fields"] = np.array([{ANSWER_KEY: out.non_tensor_batch[ANSWER_KEY][i]}])
            item.non_tensor_batch["extra_info"] = np.array([dict(out.non_tensor_batch["extra_info"][i])])
            scores.append((await manager.run_single(item))["reward_score"])
        return scores

    for i in range(len(out)):
        assert ANSWER in tiny_tokenizer.decode(out.batch["responses"][i].tolist(), skip_special_tokens=True)
    assert asyncio.run(score_all()) == out.batch["rm_scores"].sum(-1).tolist()


def test_compute_score_refuses_rows_without_the_extracted_answer():
    with pytest.raises(KeyError, match="parser_answer"):
        compute_score("synthetic", "... Miro Tal ...", [ANSWER], {"index": 0})


def test_validation_is_greedy(needle_loopback, model_dir, tiny_qwen3_5_model, tiny_tokenizer):
    config = train_config(needle_loopback.url, model_dir)
    manager = ScriptedServerManager(tiny_qwen3_5_model, tiny_tokenizer)
    out = run_verl_worker(config, manager, [dataset_row(0)], validate=True)
    assert {r.sampling_params["temperature"] for r in manager.requests} == {0}
    assert out.batch["rm_scores"].sum().item() == 1.0


def test_free_running_tiny_model_and_response_length_cut(needle_loopback, model_dir, tiny_qwen3_5_model, tiny_tokenizer):
    """A random-weight lead: whatever it emits, the episode runs to its end, the mask is 1 on
    exactly the tokens the server produced, and rollout.response_length is never exceeded."""
    config = train_config(needle_loopback.url, model_dir, [
        "parser.episode.max_turns=2", "parser.episode.max_tokens_per_turn=12", "data.max_response_length=40",
    ])
    manager = TinyModelServerManager(tiny_qwen3_5_model, tiny_tokenizer)
    out = run_verl_worker(config, manager, [dataset_row(0)])
    assert out.batch["responses"].shape[1] == 40
    mask = out.batch["response_mask"][0].bool()
    valid = out.batch["attention_mask"][0, out.batch["prompts"].shape[1]:].bool()
    produced = [ids for _, ids in manager.outputs]
    assert 1 <= len(produced) <= 2 and all(r.sampling_params["max_tokens"] <= 12 for r in manager.requests)
    assert int(valid.sum()) <= 40
    # every 1-mask token was produced by the server for this trajectory, in order (cut at 40)
    lead_tokens = out.batch["responses"][0][mask].tolist()
    assert lead_tokens == list(itertools.chain.from_iterable(produced))[: len(lead_tokens)] and lead_tokens
    stats = out.non_tensor_batch["parser_stats"][0]
    assert stats["turns"] == len(produced)


def test_v1_path_output_and_replay_buffer_metrics(needle_loopback, model_dir, tiny_qwen3_5_model, tiny_tokenizer):
    """The v1 (TransferQueue) trainer stores `AgentLoopOutput.as_dict()`; our replay buffer reads
    the sampled rows' extra_fields back into step metrics. Built as verl's worker builds it."""
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from parser.train.worker import close_worker_state
    from parser.train.sampler import ParserReplayBuffer, metrics_from_extra_fields

    config = train_config(needle_loopback.url, model_dir)
    manager = ScriptedServerManager(tiny_qwen3_5_model, tiny_tokenizer)
    (entry,) = [e for e in OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
                if e.name == "parser_agent"]

    async def one():
        loop = hydra.utils.instantiate(
            config=entry, trainer_config=DictConfigWrap(config), server_manager=manager, tokenizer=tiny_tokenizer,
            processor=None, hf_model_type=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data),
            tools=ToolListWrap([]),
        )
        try:
            return await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, **dataset_row(0))
        finally:
            await close_worker_state()

    output = asyncio.run(one())
    stored = output.as_dict()
    assert stored["rm_scores"][-1] == 1.0 and stored["rm_scores"][:-1].abs().sum() == 0
    assert stored["rollout_log_probs"].shape == stored["responses"].shape == stored["response_mask"].shape
    metrics = metrics_from_extra_fields([stored["extra_fields"]])
    assert metrics["parser/reward/mean"] == 1.0 and metrics["parser/queries_per_turn"] == 0.5

    buffer = ParserReplayBuffer(
        trainer_mode="separate_async", trainer_config=config.trainer.v1.separate_async,
        max_off_policy_threshold=2, max_off_policy_strategy="drop", refill_fn=lambda n: None,
        sampler_kwargs=config.trainer.v1.sampler.sampler_kwargs,
    )
    assert buffer.filter_groups_metric == "reward"  # dynamic sampling reaches verl's eviction logic


def test_grpo_group_fractions_count_sampled_and_evicted_groups():
    from parser.train.metrics import group_metrics
    from parser.train.sampler import rewards_by_group

    keys = ["u1_0_0", "u1_1_0", "u2_0_0", "u2_1_0", "u3_0_0", "u3_1_0"]
    rows = [{"reward_extra_info": {"acc": a}} for a in (1.0, 0.0, 1.0, 1.0, 0.0, 0.0)]
    tags = [{}] * 5 + [{"is_padding": True}]
    groups = rewards_by_group(keys, rows, tags)
    assert groups == {"u1": [1.0, 0.0], "u2": [1.0, 1.0], "u3": [0.0]}
    # verl evicted 2 all-right and 3 all-wrong groups before sampling (dynamic sampling)
    metrics = group_metrics(groups, {1.0: 2, 0.0: 3})
    assert metrics == {"parser/grpo/solve_all": 3 / 8, "parser/grpo/solve_none": 4 / 8}
    assert group_metrics({}) == {}
