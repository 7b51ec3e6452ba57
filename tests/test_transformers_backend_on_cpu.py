"""TransformersBackend on tiny random-weight Qwen3 / Qwen3.5: decoding, logprobs, sampling,
stop handling, concurrency, and the per-prefix cache (same outputs with and without it).

    .venv/bin/pytest tests/test_transformers_backend_on_cpu.py -q
"""
from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from parser.serving.types import Backend, BackendError, SamplingParams
from parser.serving.backends.transformers import TransformersBackend, _common_prefix

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, return_logprobs=True)
INSTRUCTIONS = "You read one chunk of a long document. Answer the query from the chunk, or abstain. " * 3
CHUNK = " ".join(f"Paragraph {i}. The bridge was built in {1880 + i} by the city engineer." for i in range(12))
QUERIES = ("Who built the bridge?", "When was the mill lost?", "Which paragraph names the engineer?")


@pytest.fixture(params=["qwen3", "qwen3_5"])
def model(request, tiny_qwen3_model, tiny_qwen3_5_model):
    return tiny_qwen3_model if request.param == "qwen3" else tiny_qwen3_5_model


def subagent_prompt(tok, query: str) -> list[int]:
    messages = [{"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": f"{CHUNK}\n\nQuery: {query}"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def teacher_forced_logprobs(model, prompt: list[int], out: list[int], temperature: float = 1.0) -> list[float]:
    """One uncached forward over prompt+output: the reference the backend must match."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + out])).logits[0].float() / temperature
    logp = torch.log_softmax(logits, -1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(out)]


def test_satisfies_backend_protocol(tiny_backend):
    assert isinstance(tiny_backend, Backend)


def test_greedy_matches_hf_generate_and_logprobs_match_a_full_forward(model, tiny_tokenizer):
    prompt = subagent_prompt(tiny_tokenizer, QUERIES[0])
    c = TransformersBackend(model, tiny_tokenizer).generate_ids(prompt, GREEDY)
    with torch.inference_mode():
        ref = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=GREEDY.max_new_tokens, do_sample=False)
    assert c.token_ids == ref[0, len(prompt):].tolist()
    assert c.logprobs == pytest.approx(teacher_forced_logprobs(model, prompt, c.token_ids), abs=1e-4)
    assert c.prompt_tokens == len(prompt) and c.cached_tokens == 0
    assert c.finish_reason == "length" and len(c.token_ids) == GREEDY.max_new_tokens
    assert c.text == tiny_tokenizer.decode(c.token_ids, skip_special_tokens=True)


def test_prefix_cache_reuses_instructions_and_chunk_without_changing_outputs(model, tiny_tokenizer):
    """Subagent rounds: the same chunk with a new query. Cached and uncached runs agree, and
    the shared prefix is computed once (from round 2 on it is resumed exactly)."""
    every = 64
    cached = TransformersBackend(model, tiny_tokenizer, checkpoint_every=every)
    prompts = [subagent_prompt(tiny_tokenizer, q) for q in QUERIES]
    results = []
    for p in prompts:
        c = cached.generate_ids(p, GREEDY, key="doc0:3")
        fresh = TransformersBackend(model, tiny_tokenizer).generate_ids(p, GREEDY)
        assert c.token_ids == fresh.token_ids
        assert c.logprobs == pytest.approx(fresh.logprobs, abs=1e-4)
        assert fresh.cached_tokens == 0
        results.append(c)
    l12 = _common_prefix(prompts[0], prompts[1])
    l23 = _common_prefix(prompts[1], prompts[2])
    hybrid = model.config.layer_types[0] == "linear_attention"
    assert results[0].cached_tokens == 0
    if hybrid:  # recurrent state: resume from the last checkpoint, then from the exact boundary
        assert results[1].cached_tokens == l12 - l12 % every > 0
        assert results[2].cached_tokens == min(l12, l23)
    else:  # attention only: crop the KV cache to the common prefix
        assert results[1].cached_tokens == l12
        assert results[2].cached_tokens == l23


def test_lead_turns_resume_from_the_end_of_the_previous_turn(model, tiny_tokenizer):
    backend = TransformersBackend(model, tiny_tokenizer)
    p1 = subagent_prompt(tiny_tokenizer, QUERIES[0])
    c1 = backend.generate_ids(p1, GREEDY, key="trajectory-1")
    observation = tiny_tokenizer.encode("<|im_start|>user\n<tool_response>\nagent_0: 1881\n</tool_response><|im_end|>\n"
                                        "<|im_start|>assistant\n", add_special_tokens=False)
    p2 = p1 + c1.token_ids + observation
    c2 = backend.generate_ids(p2, GREEDY, key="trajectory-1")
    fresh = TransformersBackend(model, tiny_tokenizer).generate_ids(p2, GREEDY)
    assert c2.cached_tokens == len(p1) + len(c1.token_ids) - 1  # the last sampled token never ran
    # checkpoints before the resumed point are freed, so a long trajectory does not pile them up
    assert all(p >= c2.cached_tokens for p in backend.cache_info()["trajectory-1"]["snapshots"])
    assert c2.token_ids == fresh.token_ids
    assert c2.logprobs == pytest.approx(fresh.logprobs, abs=1e-4)


def test_keys_do_not_share_entries_and_the_lru_is_bounded(tiny_qwen3_5_model, tiny_tokenizer):
    backend = TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer, max_cache_entries=2)
    prompt = subagent_prompt(tiny_tokenizer, QUERIES[0])
    short = SamplingParams(max_new_tokens=2, temperature=0)
    for key in ("a", "b", "c"):
        assert backend.generate_ids(prompt, short, key=key).cached_tokens == 0
    assert list(backend.cache_info()) == ["b", "c"]
    assert backend.generate_ids(prompt, short, key="a").cached_tokens == 0  # evicted
    assert backend.generate_ids(prompt, short, key="c").cached_tokens > 0
    one_entry = backend.cache_info()["c"]["bytes"]
    assert one_entry > 0
    tight = TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer, max_cache_bytes=int(one_entry * 1.5))
    tight.generate_ids(prompt, short, key="a")
    tight.generate_ids(prompt, short, key="b")
    assert list(tight.cache_info()) == ["b"]


def test_sampling_is_seeded_and_logprobs_follow_the_temperature(tiny_qwen3_model, tiny_tokenizer):
    backend = TransformersBackend(tiny_qwen3_model, tiny_tokenizer)
    prompt = subagent_prompt(tiny_tokenizer, QUERIES[1])
    hot = SamplingParams(max_new_tokens=10, temperature=1.5, seed=7, return_logprobs=True)
    a, b = backend.generate_ids(prompt, hot), backend.generate_ids(prompt, hot)
    assert a.token_ids == b.token_ids
    others = {tuple(backend.generate_ids(prompt, SamplingParams(max_new_tokens=10, temperature=1.5, seed=s)).token_ids)
              for s in range(4)}
    assert len(others) > 1  # near-uniform tiny model: different seeds, different draws
    assert a.logprobs == pytest.approx(teacher_forced_logprobs(tiny_qwen3_model, prompt, a.token_ids, 1.5), abs=1e-4)
    top1 = backend.generate_ids(prompt, SamplingParams(max_new_tokens=10, temperature=1.5, top_k=1, seed=3))
    assert top1.token_ids == backend.generate_ids(prompt, GREEDY).token_ids[:10]
    nucleus = backend.generate_ids(prompt, SamplingParams(max_new_tokens=10, temperature=1.0, top_p=1e-6, seed=3))
    assert nucleus.token_ids == top1.token_ids
    raw = TransformersBackend(tiny_qwen3_model, tiny_tokenizer, logprobs_before_temperature=True)
    c = raw.generate_ids(prompt, hot)
    assert c.logprobs == pytest.approx(teacher_forced_logprobs(tiny_qwen3_model, prompt, c.token_ids, 1.0), abs=1e-4)


def test_stop_strings_and_eos_end_the_turn(tiny_qwen3_model, tiny_tokenizer):
    backend = TransformersBackend(tiny_qwen3_model, tiny_tokenizer)
    prompt = subagent_prompt(tiny_tokenizer, QUERIES[2])
    free = backend.generate_ids(prompt, SamplingParams(max_new_tokens=24, temperature=1.0, seed=1))
    assert free.finish_reason == "length"
    stop = free.text[len(free.text) // 2:][:3]
    assert stop.strip(), free.text
    cut = backend.generate_ids(prompt, SamplingParams(max_new_tokens=24, temperature=1.0, seed=1, stop=(stop,)))
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[:free.text.find(stop)]
    assert free.token_ids[:len(cut.token_ids)] == cut.token_ids and len(cut.token_ids) < 24

    first = free.token_ids[0]
    eos_backend = TransformersBackend(tiny_qwen3_model, tiny_tokenizer)
    eos_backend.eos_ids = {first}  # pretend the first sampled token is <|im_end|>
    c = eos_backend.generate_ids(prompt, SamplingParams(max_new_tokens=24, temperature=1.0, seed=1))
    assert (c.finish_reason, c.token_ids, c.text) == ("stop", [first], "")
    assert tiny_tokenizer.convert_tokens_to_ids("<|im_end|>") in backend.eos_ids


def test_prompt_forms_agree(tiny_backend, tiny_tokenizer):
    messages = [{"role": "user", "content": "Who built the bridge?"}]
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    s = SamplingParams(max_new_tokens=4, temperature=0)
    outs = [asyncio.run(tiny_backend.generate(p, s)) for p in (ids, tuple(ids), text, messages)]
    assert all(o.token_ids == outs[0].token_ids and o.prompt_tokens == len(ids) for o in outs)


def test_bad_requests_raise_backend_errors(tiny_backend):
    with pytest.raises(BackendError, match="empty prompt"):
        asyncio.run(tiny_backend.generate([], GREEDY))
    with pytest.raises(BackendError, match="max_new_tokens"):
        asyncio.run(tiny_backend.generate([1, 2], SamplingParams(max_new_tokens=0)))


def test_concurrent_calls_are_safe_and_the_loop_stays_responsive(tiny_qwen3_5_model, tiny_tokenizer, monkeypatch):
    """Concurrent requests give what one-at-a-time requests give, and the model runs off the event
    loop: the first forward pass waits until a coroutine on the loop lets it go. Were the forward
    on the loop's thread, nothing could run until it returned and it would wait in vain."""
    backend = TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer)
    prompts = [subagent_prompt(tiny_tokenizer, q) for q in QUERIES]
    sequential = [TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer).generate_ids(p, GREEDY) for p in prompts]
    forwarding, go_on = threading.Event(), threading.Event()
    forward = tiny_qwen3_5_model.forward

    def gated_forward(*args, **kwargs):
        forwarding.set()
        assert go_on.wait(60), "event loop starved: no coroutine ran while a forward pass was in progress"
        return forward(*args, **kwargs)

    monkeypatch.setattr(tiny_qwen3_5_model, "forward", gated_forward)

    async def main():
        outs = asyncio.gather(*(backend.generate(p, GREEDY, routing_key=f"d:{i % 2}") for i, p in enumerate(prompts)))
        assert await asyncio.to_thread(forwarding.wait, 60), "no forward pass started"
        go_on.set()  # run by the loop while the forward pass waits
        return await outs

    outs = asyncio.run(main())
    for got, want in zip(outs, sequential, strict=True):
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)


def test_from_pretrained_loads_a_saved_model_offline(tiny_qwen3_model, tiny_tokenizer, tmp_path):
    tiny_qwen3_model.save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    loaded = TransformersBackend.from_pretrained(str(tmp_path), dtype=torch.float32)
    prompt = subagent_prompt(tiny_tokenizer, QUERIES[0])
    want = TransformersBackend(tiny_qwen3_model, tiny_tokenizer).generate_ids(prompt, GREEDY)
    assert loaded.generate_ids(prompt, GREEDY).token_ids == want.token_ids
