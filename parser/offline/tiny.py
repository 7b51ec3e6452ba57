"""Tiny real objects for CPU tests: an in-process byte-level BPE tokenizer and random-weight
Qwen3 / Qwen3.5 models that run the real transformers code paths in milliseconds.

Why it exists: tests should fake only the outer edge. These are real tokenizers and real
models (same classes, same chat template, same cache types as the production checkpoints),
just small and untrained, so everything between the episode engine and the logits is the
code that runs in production. Measured with one torch thread on the 2-core machine while
other jobs shared it (load ~7): forward over 2K tokens + logprobs 0.14 s (Qwen3) / 0.17 s
(Qwen3.5); 64 decoded tokens 0.38 s / 0.27 s. Two threads were 3-10x slower under that load,
which is why tests/conftest.py sets OMP_NUM_THREADS=1.

    from parser.offline import byte_bpe_tokenizer, tiny_qwen3_5
    tok = byte_bpe_tokenizer(); model = tiny_qwen3_5(tok)

Used by the tests and by the demo's `models=tiny_cpu` (through `parser.offline.models`).
Must never: download anything (both are built in process).
"""
from __future__ import annotations

import functools

# Chat control tokens, as in Qwen: the first three are special (dropped by
# skip_special_tokens), the tag pairs are ordinary added tokens (kept in decoded text).
CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TAG_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
TINY_VOCAB_SIZE = 1024

# A few paragraphs of plain English, the shapes the tests feed (questions, JSON findings,
# tool calls), so that the learned merges make typical test text a few characters per token.
_CORPUS = """\
The lead agent never reads the document. It asks short questions, and a reader for each chunk
answers with a finding or says that the chunk does not help. The findings are gathered, the
abstentions are dropped, and the lead reasons over what came back before it answers.
Question: Who wrote the letter that was found in the library of the old house in 1921?
Answer: The letter was written by Margaret Hale, the daughter of the first owner of the house.
{"answer": "unknown"} {"answer": "The bridge was built in 1887 by the city engineer.", "evidence": "paragraph 12"}
<tool_call>
<function=query_agents>
<parameter=query>
When did the river flood the town, and which buildings were lost?
</parameter>
</function>
</tool_call>
<tool_response>
agent_0: The flood of 1903 destroyed the mill and the school.
agent_3: The church on the hill was not damaged.
</tool_response>
<think>
The readers agree on the year. I still need the name of the mayor at the time, so I will ask
one more question about the town council records before I give the final answer.
</think>
Paragraph 1. In the spring of that year the railway reached the valley, and with it came new
families, new shops, and a newspaper that printed the names of everyone who arrived by train.
Paragraph 2. The museum keeps a map of the old streets; most of them were renamed after the war,
but the market square, the station road and the bridge street still carry their first names.
Numbers and dates: 1, 2, 3, 10, 42, 100, 1999, 2024; 3.14; 12:30; 50% of 800 is 400.
Code: def answer(question): return find(question, chunks)[0] if chunks else None
"""


_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there been one all we their has would when if so no what up out who "
    "them some could him into its then two more these time may do first any my now such like our over "
    "man me even most made after also did many before must through years where much your way well down "
    "should because each just those people how too little state good very make world still own see men "
    "work long get here between both life being under never day same another know while last might us "
    "great old year off come since against go came right used take three city river bridge letter house "
    "question answer chunk document reader finding evidence paragraph agent query lead library museum "
    "station market school church mill flood war railway newspaper mayor council record name date town"
).split()


def _corpus_lines() -> list[str]:
    """The built-in text plus deterministic sentences over a common-word list, enough text for
    the trainer to learn the full merge budget."""
    import random

    rng = random.Random(0)
    lines = _CORPUS.splitlines(keepends=True)
    for i in range(400):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 16))]
        end = rng.choice([".", "?", "!", ",", ";", ":"])
        lines.append(f"{words[0].capitalize()} {' '.join(words[1:])}{end} ({i})\n")
    return lines


@functools.cache
def byte_bpe_tokenizer():
    """A byte-level BPE tokenizer (~1K tokens) trained in-process on a small built-in corpus,
    with Qwen's pre-tokenizer, chat control tokens as single tokens, eos=`<|im_end|>`,
    pad=`<|endoftext|>`, and the real Qwen3.5 chat template (from the asset cache). Built once
    per process; every byte string round-trips."""
    return bpe_tokenizer(_corpus_lines(), TINY_VOCAB_SIZE)


def bpe_tokenizer(lines: list[str], vocab_size: int):
    """`byte_bpe_tokenizer`'s recipe on other text: a tokenizer whose merges fit `lines` (e.g.
    the CPU learning run's prompts and world, so its names are a few tokens, not one per letter)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from parser.offline.assets import QWEN3_5_PRETOKENIZE_REGEX, qwen3_5_chat_template

    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN3_5_PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(CONTROL_TOKENS) - len(TAG_TOKENS),
        min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(lines, trainer=trainer)
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in CONTROL_TOKENS])
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in TAG_TOKENS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
    )
    tok.chat_template = qwen3_5_chat_template()
    return tok


def _ids(tokenizer) -> dict[str, int]:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return {"eos": eos, "pad": pad, "stop": [eos, eot] if eot is not None and eot != eos else [eos]}


def _finish(model, tokenizer):
    ids = _ids(tokenizer)
    model.generation_config.eos_token_id = ids["stop"]
    model.generation_config.pad_token_id = ids["pad"]
    model.generation_config.bos_token_id = None
    model.generation_config.do_sample = False
    return model.eval()


def _common(tokenizer) -> dict:
    ids = _ids(tokenizer)
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        bos_token_id=None,
    )


def tiny_qwen3(tokenizer=None, *, seed: int = 0, **overrides):
    """A random-weight `Qwen3ForCausalLM` (hidden 64, 2 attention layers), eval mode.
    `overrides` change config fields (e.g. head_dim=64 for GPU attention kernels)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = tokenizer or byte_bpe_tokenizer()
    torch.manual_seed(seed)
    config = Qwen3Config(**{**_common(tokenizer), **overrides})
    return _finish(Qwen3ForCausalLM(config), tokenizer)


def tiny_qwen3_5(tokenizer=None, *, seed: int = 0, **overrides):
    """A random-weight `Qwen3_5ForCausalLM` (hidden 64; one gated-delta-net linear-attention
    layer then one full-attention layer, like Qwen3.5's 3:1 hybrid stack in miniature), eval
    mode. Its cache mixes recurrent state (not croppable) with KV (croppable)."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    tokenizer = tokenizer or byte_bpe_tokenizer()
    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(**{
        **_common(tokenizer),
        "layer_types": ["linear_attention", "full_attention"],
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        **overrides,
    })
    return _finish(Qwen3_5ForCausalLM(config), tokenizer)
