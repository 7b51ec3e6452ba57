"""What one resident chunk prefix costs in a worker's cache, from the model's config.json.

Why it exists: ParSer is fast only while every chunk's `instructions + chunk` prefix stays in
the cache of the worker its chunk is pinned to (SGLang's RadixCache; the CPU backend's prefix
cache). Whether it stays is arithmetic over the model's shape:

* full-attention layers keep K and V for every token:
  `2 * kv_heads * head_dim * dtype_bytes` per layer per token;
* Qwen3.5's linear-attention (Gated DeltaNet) layers keep one fixed-size state per sequence,
  whatever its length: the recurrent state `value_heads * key_head_dim * value_head_dim`
  (SGLang keeps it in `mamba_ssm_dtype`, float32) plus the causal-conv window
  `(2 * key_heads * key_head_dim + value_heads * value_head_dim) * (conv_kernel - 1)` in the
  model dtype, per layer.

    spec = ModelSpec.from_hf_config(json.load(open("Qwen3.5-4B/config.json")))
    spec.prefix_bytes(4_300)        # one resident 4,096-token chunk + instructions
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
               "fp8": 1, "float8_e4m3fn": 1, "int8": 1}


def dtype_bytes(name: str | int) -> int:
    if isinstance(name, int):
        return name
    key = str(name).removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPE_BYTES)} or a byte count")
    return DTYPE_BYTES[key]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The parts of a model's shape that decide its cache and weight memory."""

    name: str
    full_attention_layers: int
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: int
    weight_bytes: int
    linear_attention_layers: int = 0
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    ssm_dtype_bytes: int = 4
    conv_dtype_bytes: int = 2
    conv_positions: int | None = None  # conv window kept per sequence: SGLang kernel - 1 (None), transformers kernel

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], *, name: str | None = None, kv_dtype: str | int | None = None,
                       weight_bytes: int | None = None, dtype: str | int | None = None,
                       conv_positions: int | None = None) -> "ModelSpec":
        """From a Hugging Face config.json mapping (a multimodal Qwen3.5 config's `text_config`
        is used). `kv_dtype` overrides the cache dtype (e.g. an fp8 KV cache); `weight_bytes`
        overrides the estimate from the config (e.g. the checkpoint's safetensors size);
        `dtype` the model dtype where the config has none (a model built in memory)."""
        text = dict(config.get("text_config") or config)
        model_dtype = dtype_bytes(dtype or text.get("dtype") or text.get("torch_dtype") or config.get("torch_dtype")
                                  or "bfloat16")
        layers = int(text["num_hidden_layers"])
        types = text.get("layer_types")
        if types is None and "full_attention_interval" in text:
            every = int(text["full_attention_interval"])
            types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)]
        types = list(types or ["full_attention"] * layers)
        if len(types) != layers:
            raise ValueError(f"config: layer_types has {len(types)} entries for num_hidden_layers={layers}")
        unknown = set(types) - {"full_attention", "linear_attention"}
        if unknown:
            raise ValueError(f"config: layer types {sorted(unknown)} are not modelled (full_attention, linear_attention)")
        heads = int(text["num_attention_heads"])
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        spec = cls(
            name=name or str(text.get("_name_or_path") or text.get("model_type") or "model"),
            full_attention_layers=types.count("full_attention"),
            kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            kv_dtype_bytes=dtype_bytes(kv_dtype) if kv_dtype is not None else model_dtype,
            weight_bytes=0,
            linear_attention_layers=types.count("linear_attention"),
            linear_key_heads=int(text.get("linear_num_key_heads", 0)),
            linear_value_heads=int(text.get("linear_num_value_heads", 0)),
            linear_key_head_dim=int(text.get("linear_key_head_dim", 0)),
            linear_value_head_dim=int(text.get("linear_value_head_dim", 0)),
            linear_conv_kernel=int(text.get("linear_conv_kernel_dim", 0)),
            ssm_dtype_bytes=dtype_bytes(text.get("mamba_ssm_dtype", "float32")),
            conv_dtype_bytes=model_dtype,
            conv_positions=conv_positions,
        )
        estimate = estimate_parameters(text) * model_dtype
        return dataclasses.replace(spec, weight_bytes=int(weight_bytes) if weight_bytes else estimate)

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> "ModelSpec":
        return cls.from_hf_config(json.loads(Path(path).read_text(encoding="utf-8")), **kwargs)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.full_attention_layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def state_bytes_per_sequence(self) -> int:
        """The fixed-size linear-attention state of one cached sequence (0 for pure attention)."""
        if not self.linear_attention_layers:
            return 0
        recurrent = self.linear_value_heads * self.linear_key_head_dim * self.linear_value_head_dim * self.ssm_dtype_bytes
        channels = (2 * self.linear_key_heads * self.linear_key_head_dim
                    + self.linear_value_heads * self.linear_value_head_dim)
        positions = self.conv_positions if self.conv_positions is not None else max(self.linear_conv_kernel - 1, 0)
        conv = channels * positions * self.conv_dtype_bytes
        return self.linear_attention_layers * (recurrent + conv)

    def prefix_bytes(self, tokens: int) -> int:
        """Cache memory of one resident prefix of `tokens` tokens."""
        return tokens * self.kv_bytes_per_token + self.state_bytes_per_sequence


def estimate_parameters(text: Mapping[str, Any]) -> int:
    """Weights count from the config (dense decoder; Qwen3.5 hybrid layers included).

    Counts embeddings (twice if untied), attention / linear-attention projections and the
    gated MLP; norms and biases are ignored (well under 0.1%)."""
    hidden = int(text["hidden_size"])
    layers = int(text["num_hidden_layers"])
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or hidden // heads)
    kv = int(text.get("num_key_value_heads") or heads)
    vocab = int(text["vocab_size"])
    mlp = 3 * hidden * int(text["intermediate_size"])
    gate = 2 if text.get("attn_output_gate") else 1
    attention = hidden * heads * head_dim * gate + 2 * hidden * kv * head_dim + heads * head_dim * hidden
    types = text.get("layer_types")
    if types is None and "full_attention_interval" in text:
        every = int(text["full_attention_interval"])
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)]
    linear_layers = list(types or []).count("linear_attention")
    nk, nv = int(text.get("linear_num_key_heads", 0)), int(text.get("linear_num_value_heads", 0))
    dk, dv = int(text.get("linear_key_head_dim", 0)), int(text.get("linear_value_head_dim", 0))
    conv_channels = 2 * nk * dk + nv * dv
    linear = (hidden * (conv_channels + nv * dv + 2 * nv)  # in_proj_qkvz + in_proj_ba
              + conv_channels * int(text.get("linear_conv_kernel_dim", 0)) + nv * dv * hidden)
    embeddings = vocab * hidden * (1 if text.get("tie_word_embeddings", True) else 2)
    return (embeddings + layers * mlp + (layers - linear_layers) * attention + linear_layers * linear)
