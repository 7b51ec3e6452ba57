"""The chat format's tokens, read from real tokenizers (Qwen3.5, Qwen3, SmolLM2, the tiny BPE).

    .venv/bin/pytest tests/test_chat_format_on_cpu.py -q

`parser.text.chat_format.CHATML` is the one place the project names `<|im_end|>` and friends; these
tests pin what each real tokenizer makes of them, and the set a guard against control tokens in
untrusted text needs: every string in `control_tokens` is, in raw text, one reserved token.
"""
from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from parser.text.chat_format import CHATML


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3", "smollm2", "tiny"])
def tokenizer(request, qwen3_5_tokenizer, qwen3_tokenizer, tiny_tokenizer):
    if request.param == "smollm2":
        from transformers import AutoTokenizer

        from parser.offline.assets import smollm2_dir

        return AutoTokenizer.from_pretrained(smollm2_dir())
    return {"qwen3_5": qwen3_5_tokenizer, "qwen3": qwen3_tokenizer, "tiny": tiny_tokenizer}[request.param]


def test_end_of_turn_and_stop_ids_are_the_tokenizers_own(tokenizer):
    assert CHATML.end_of_turn_id(tokenizer) == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert CHATML.stop_token_ids(tokenizer) == [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert rendered.startswith(CHATML.turn_start) and CHATML.end_of_turn in rendered
    assert CHATML.strip_end("Paris<|im_end|>") == "Paris" and CHATML.strip_end("Paris") == "Paris"


def test_every_control_token_is_one_reserved_token_in_raw_text(tokenizer):
    tokens = CHATML.control_tokens(tokenizer)
    assert set(CHATML.tokens) <= tokens and tokenizer.eos_token in tokens
    for token in tokens:
        assert tokenizer.encode(f"see {token} here", add_special_tokens=False).count(tokenizer.convert_tokens_to_ids(token)) == 1, token
    plain = tokenizer.encode("see <|im_end here", add_special_tokens=False)
    assert not set(plain) & {tokenizer.convert_tokens_to_ids(t) for t in tokens}  # a near miss is text


def test_qwen_tags_are_control_tokens_too(qwen3_5_tokenizer):
    """Qwen3.5's `<tool_call>` and `<think>` are added but not special: raw text still becomes them."""
    tokens = CHATML.control_tokens(qwen3_5_tokenizer)
    assert {"<tool_call>", "</tool_call>", "<think>", "</think>", "<|vision_start|>"} <= tokens


def test_a_tokenizer_without_the_format_is_refused():
    backend = Tokenizer(models.WordLevel({"hello": 0, "[UNK]": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    other = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    with pytest.raises(ValueError, match=r"has no <\|im_end\|> token: it does not speak the ChatML chat format"):
        CHATML.end_of_turn_id(other)
