"""The CPU plug-ins verl's trainer runs on (parser/train/cpu), each on its own, in seconds.

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
    from parser.train.cpu.weight_sync import GlooCheckpointEngine

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
    from parser.offline import byte_bpe_tokenizer, tiny_qwen3

    tok = byte_bpe_tokenizer()
    path = tmp_path_factory.mktemp("lead")
    tiny_qwen3(tok).save_pretrained(path)
    tok.save_pretrained(path)
    return path, tok


def test_rollout_server_reports_versions_and_uses_the_weights_it_is_sent(lead_dir):
    from types import SimpleNamespace

    from parser.train.cpu.rollout import TransformersRolloutServer

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


def test_rollout_server_answers_verls_prompt_logprobs_as_a_forward_pass_would(lead_dir):
    """verl's `prompt_logprobs: 0` (InfoMem's policy scorer, verl's distillation teacher): one row
    per prompt token in verl's layout (row p: token p+1), the last a dummy."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from parser.train.cpu.rollout import TransformersRolloutServer

    path, tok = lead_dir
    server = TransformersRolloutServer(SimpleNamespace(response_length=64), SimpleNamespace(path=str(path)), 0)
    ids = tok.encode("Question: who wrote the letter? Answer: Ada", add_special_tokens=False)
    out = asyncio.run(server.generate(ids, {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}, request_id="s"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        ref = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    assert out.extra_fields["prompt_ids"] == [[t] for t in ids[1:]] + [[0]]
    rows = out.extra_fields["prompt_logprobs"]
    assert len(rows) == len(ids) and rows[-1] == [0.0]
    assert [r[0] for r in rows[:-1]] == pytest.approx([float(ref[p, ids[p + 1]]) for p in range(len(ids) - 1)], abs=1e-4)
    with pytest.raises(ValueError, match="prompt_logprobs=5"):
        asyncio.run(server.generate(ids, {"max_tokens": 1, "prompt_logprobs": 5}, request_id="s"))


def test_rollout_server_batches_concurrent_requests_and_a_weight_load_waits_for_them(lead_dir):
    """Requests in flight together reach the backend together (it decodes them as one batch); a
    weight load issued meanwhile waits for them, so each reports the one version it ran on."""
    from types import SimpleNamespace

    from parser.train.cpu.rollout import TransformersRolloutServer

    path, tok = lead_dir
    server = TransformersRolloutServer(SimpleNamespace(response_length=64), SimpleNamespace(path=str(path)), 0)
    prompt = tok.encode("Question: who wrote the letter?", add_special_tokens=False)
    sampling = {"temperature": 1.0, "max_tokens": 16, "logprobs": True}
    submitted, submit = [], server.backend.submit
    server.backend.submit = lambda *a, **k: (submitted.append(server._in_flight), submit(*a, **k))[1]

    async def go():
        first = [asyncio.create_task(server.generate(prompt, sampling, request_id=f"r{i}")) for i in range(4)]
        await asyncio.sleep(0)  # the four are in flight
        state = {k: v.clone() for k, v in server.backend.model.state_dict().items()}
        load = asyncio.create_task(server.load_weights(state, global_steps=5))
        await asyncio.sleep(0)
        later = asyncio.create_task(server.generate(prompt, sampling, request_id="r9"))
        return await asyncio.gather(*first), await load, await later

    first, _, later = asyncio.run(go())
    assert max(submitted) == 4  # all four were submitted before any finished
    assert [c.extra_fields["global_steps"] for c in first] == [None] * 4
    assert later.extra_fields["global_steps"] == 5


def test_backend_string_fix_drops_only_an_exact_repeat():
    from parser.train.cpu import _dedupe_backend

    assert _dedupe_backend("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert _dedupe_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert _dedupe_backend("gloo") == "gloo" and _dedupe_backend(None) is None


def test_decoupled_ppo_keeps_a_real_copy_of_pi_old_on_cpu():
    """separate_async keeps the last sync's weights (π_old) with verl's `fsdp2_sharded_save_to_cpu`
    and restores them for later mini-batches' old log-probs. On a CPU its `.cpu()` returned the
    live shard itself, so an optimizer step changed the kept π_old too (the trainer smoke's
    step-1 rollout-vs-actor gap, 0.004-0.006). With parser.train.cpu loaded, restore gives π_old back."""
    import socket

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import parser.train.cpu  # noqa: F401  (the plug-ins, as verl loads them)
    from verl.utils import fsdp_utils

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        before = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
        kept, spec = fsdp_utils.fsdp2_sharded_save_to_cpu(model)  # what save_model_to_cpu(0) calls
        with torch.no_grad():  # an optimizer step: in place, as AdamW's
            for p in model.parameters():
                p.add_(1.0)
        assert all(not torch.equal(p.full_tensor(), before[n]) for n, p in model.named_parameters())
        fsdp_utils.fsdp2_sharded_load_from_cpu(model, kept, spec)  # restore_model_from_cpu(0)
        for n, p in model.named_parameters():
            assert torch.equal(p.full_tensor(), before[n]), n
    finally:
        dist.destroy_process_group()
