"""The CPU plug-ins verl's trainer runs on (parser/verl/cpu), each on its own, in seconds.

    .venv/bin/pytest tests/test_verl_cpu_plugins_on_cpu.py -q

tests/e2e/test_verl_trainer_on_cpu.py runs them together inside verl's trainer; these pin down
what each one promises: the gloo weight sync delivers every tensor bit for bit (buckets,
dtypes, a tensor larger than a bucket), the rollout server reports the weight version each
request ran on and generates with the weights it was sent, and the backend-string fix only
drops an exact repeat.
"""
from __future__ import annotations

import asyncio
import threading

import pytest
import torch

pytest.importorskip("verl")


def test_gloo_weight_sync_delivers_every_tensor_exactly():
    from parser.verl.cpu.weight_sync import GlooCheckpointEngine

    weights = {
        "embed": torch.randn(64, 16),
        "big": torch.randn(300, 100),  # 120 KB > the 64 KB bucket: sent alone
        "norm": torch.randn(16).to(torch.bfloat16),
        "step": torch.tensor([7], dtype=torch.int64),
    }
    bucket = 64 << 10
    trainer = [GlooCheckpointEngine(bucket, is_master=True), GlooCheckpointEngine(bucket, is_master=False)]
    rollout = GlooCheckpointEngine(bucket)
    metadata = [e.prepare() for e in trainer] + [rollout.prepare()]
    actor_kwargs, rollout_kwargs = GlooCheckpointEngine.build_topology(2, 1, metadata)
    assert actor_kwargs["rank"] == [0, -1] and rollout_kwargs["rank"] == [1]
    received: dict[str, torch.Tensor] = {}
    drained: list[str] = []

    def drain_generator():  # a non-root trainer rank still walks its generator (FSDP gathers)
        for name, tensor in weights.items():
            drained.append(name)
            yield name, tensor

    def run_rollout():
        rollout.init_process_group(**{k: v[0] for k, v in rollout_kwargs.items()})

        async def go():
            async for name, tensor in rollout.receive_weights():
                received[name] = tensor.clone()

        asyncio.run(go())

    thread = threading.Thread(target=run_rollout)
    thread.start()
    for i, engine in enumerate(trainer):
        engine.init_process_group(**{k: v[i] for k, v in actor_kwargs.items()})
    asyncio.run(trainer[0].send_weights(iter(weights.items())))
    asyncio.run(trainer[1].send_weights(drain_generator()))
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert drained == list(weights)
    assert list(received) == list(weights)
    for name, tensor in weights.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name
    for engine in (*trainer, rollout):
        engine.finalize()


@pytest.fixture(scope="module")
def lead_dir(tmp_path_factory):
    from parser.testing import byte_bpe_tokenizer, tiny_qwen3

    tok = byte_bpe_tokenizer()
    path = tmp_path_factory.mktemp("lead")
    tiny_qwen3(tok).save_pretrained(path)
    tok.save_pretrained(path)
    return path, tok


def test_rollout_server_reports_versions_and_uses_the_weights_it_is_sent(lead_dir):
    from types import SimpleNamespace

    from parser.verl.cpu.rollout import TransformersRolloutServer

    path, tok = lead_dir
    server = TransformersRolloutServer(SimpleNamespace(response_length=64), SimpleNamespace(path=str(path)), 0)
    prompt = tok.encode("Question: who wrote the letter?", add_special_tokens=False)
    greedy = {"temperature": 0, "max_tokens": 8, "logprobs": True,
              "stop_token_ids": [tok.convert_tokens_to_ids("<|im_end|>")]}

    async def go():
        before = await server.generate(prompt, greedy, request_id="r1")
        state = {k: torch.zeros_like(v) if k.endswith("lm_head.weight") or "embed" in k else v.clone()
                 for k, v in server.backend.model.state_dict().items()}
        await server.load_weights(state, global_steps=3)
        after = await server.generate(prompt, greedy, request_id="r1")  # same request id: no stale cache
        return before, after

    before, after = asyncio.run(go())
    assert before.extra_fields["global_steps"] is None and after.extra_fields["global_steps"] == 3
    assert len(before.log_probs) == len(before.token_ids) and before.stop_reason in ("stop", "length")
    # zero embeddings: every logit is 0, log-prob = -log(vocab) for each token
    assert after.log_probs[0] == pytest.approx(-torch.log(torch.tensor(float(len(tok)))).item(), abs=1e-4)
    assert before.log_probs[0] != pytest.approx(after.log_probs[0], abs=1e-4)


def test_backend_string_fix_drops_only_an_exact_repeat():
    from parser.verl.cpu import _dedupe_backend

    assert _dedupe_backend("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert _dedupe_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert _dedupe_backend("gloo") == "gloo" and _dedupe_backend(None) is None
