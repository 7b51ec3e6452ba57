"""SGLangEngineBackend on a real in-process `sglang.Engine` (needs CUDA and the `gpu` extra).

    .venv/bin/pytest tests/gpu/test_sglang_engine.py -q      # skipped without CUDA or sglang

The model is a small random-weight Qwen3 (head_dim 64 for the GPU attention kernels) written
to a temp dir with the in-process tokenizer, so the test needs no download. SGLang runs it in
float32 and its logprobs are checked against a float32 transformers forward.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("sglang")
if not torch.cuda.is_available():  # pragma: no cover - conftest also skips tests/gpu/ without CUDA
    pytest.skip("needs CUDA", allow_module_level=True)

from parser.serving.types import SamplingParams  # noqa: E402
from parser.serving.backends.sglang_engine import SGLangEngineBackend  # noqa: E402
from parser.offline import tiny_qwen3  # noqa: E402

GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0, return_logprobs=True)


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny_tokenizer):
    model = tiny_qwen3(tiny_tokenizer, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=64)
    path = tmp_path_factory.mktemp("tiny_qwen3_gpu")
    model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    backend = SGLangEngineBackend(model_path=str(path), tokenizer=tiny_tokenizer, dtype="float32",
                                  mem_fraction_static=0.2, disable_cuda_graph=True, random_seed=0)
    yield backend, model
    backend.engine.shutdown()


def run(backend, coro):
    return backend.engine.loop.run_until_complete(coro)  # the loop the engine is bound to


def prompt_ids(tok, question: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "system", "content": "Answer from the chunk. " * 20},
                                    {"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def test_token_prompt_returns_ids_logprobs_and_counts(engine, tiny_tokenizer):
    backend, model = engine
    ids = prompt_ids(tiny_tokenizer, "Who built the bridge?")
    c = run(backend, backend.generate(ids, GREEDY, request_id="t1"))
    assert c.prompt_tokens == len(ids)
    assert 0 < len(c.token_ids) <= GREEDY.max_new_tokens and len(c.logprobs) == len(c.token_ids)
    assert c.finish_reason == ("length" if len(c.token_ids) == GREEDY.max_new_tokens else "stop")
    with torch.inference_mode():
        logits = model.float()(torch.tensor([ids + c.token_ids])).logits[0]
    ref = torch.log_softmax(logits, -1)
    want = [float(ref[len(ids) - 1 + i, t]) for i, t in enumerate(c.token_ids)]
    assert c.logprobs == pytest.approx(want, abs=2e-2)


def test_radix_cache_reuses_a_shared_prefix(engine, tiny_tokenizer):
    backend, _ = engine
    first = prompt_ids(tiny_tokenizer, "When was the mill lost?")
    run(backend, backend.generate(first, GREEDY))
    second = prompt_ids(tiny_tokenizer, "Which paragraph names the engineer?")
    c = run(backend, backend.generate(second, GREEDY, routing_key="doc0:1"))
    assert c.cached_tokens >= 16  # at least the repeated system prompt


def test_text_and_message_prompts_and_stop_strings(engine, tiny_tokenizer):
    backend, _ = engine
    messages = [{"role": "user", "content": "Who built the bridge?"}]
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    by_ids = run(backend, backend.generate(ids, GREEDY))
    by_text = run(backend, backend.generate(text, GREEDY))
    by_messages = run(backend, backend.generate(messages, GREEDY))
    assert by_ids.token_ids == by_text.token_ids == by_messages.token_ids
    sampled = SamplingParams(max_new_tokens=24, temperature=1.0, seed=1)
    free = run(backend, backend.generate(ids, sampled))
    if len(free.text) >= 6:
        stop = free.text[3:6]
        cut = run(backend, backend.generate(ids, SamplingParams(max_new_tokens=24, temperature=1.0, seed=1, stop=(stop,))))
        assert cut.finish_reason == "stop" and stop not in cut.text


def test_score_matches_a_forward_pass_of_the_same_model(engine, tiny_tokenizer):
    """Answer scoring on the engine (input logprobs, zero new tokens) equals teacher forcing."""
    backend, model = engine
    prompt = prompt_ids(tiny_tokenizer, "Who built the bridge?")
    answer = tiny_tokenizer.encode("Ada Okafor built it in 1911.", add_special_tokens=False)
    scores = run(backend, backend.score(prompt, answer, request_id="s1"))
    with torch.inference_mode():
        logits = model.float()(torch.tensor([prompt + answer])).logits[0]
    ref = torch.log_softmax(logits, -1)
    want = [float(ref[len(prompt) - 1 + i, t]) for i, t in enumerate(answer)]
    assert len(scores) == len(answer)
    assert scores == pytest.approx(want, abs=2e-2)


@pytest.mark.parametrize("constraint", [{"regex": "(yes|no)"},
                                        {"json_schema": '{"type": "object", "properties": {"answer": {"type": "string"}},'
                                                        ' "required": ["answer"], "additionalProperties": false}'}])
def test_constrained_decoding_reaches_the_engine(engine, tiny_tokenizer, constraint):
    """json_schema / regex arrive in the engine's sampling_params: a random model's output obeys them."""
    import json
    import re

    backend, _ = engine
    ids = prompt_ids(tiny_tokenizer, "Is the bridge older than the mill?")
    c = run(backend, backend.generate(ids, SamplingParams(max_new_tokens=32, temperature=0.0, **constraint)))
    if "regex" in constraint:
        assert re.fullmatch(constraint["regex"], c.text), c.text
    else:
        assert isinstance(json.loads(c.text)["answer"], str), c.text
