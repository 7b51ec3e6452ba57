"""Agentic RAG (paper Appendix D.3): the lead agent with a dense `retrieve_documents(query)` tool.

The document is cut into fixed-size chunks (1,024 tokens, the same paragraph-packing as
ParSer's chunking), embedded once per sample; each call returns the top 3 chunks by cosine
similarity of L2-normalised embeddings, as a JSON observation (query; rank, score, index and
text per chunk). The agent runs in the one episode engine (`parser.engine.episode`) with the `RetrievalTools` tool
set: ReAct loop, temperature 0, 2,048 new tokens a turn, at most 16 turns, a continuation prompt
after a cut turn and a tool-free finalize turn when the turns run out (the `episode` section of
configs/method/rag.yaml; the last two are the tool set's `TurnRules`). Its prompts and `retrieve_documents` schema are `prompts/v1/` beside this file. The embedder comes from the models config or this method's
`embedder` section (`parser.serving.backends.embedder`).

    parser eval method=rag
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping

import numpy as np
import orjson

from parser.text.chunking import chunk_document
from parser.engine.episode import baseline_engine
from parser.serving.backends.embedder import build_embedder
from parser.serving.backends.models import Models
from parser.methods.base import MethodResult, Sample
from parser.engine.prompts import DEFAULT_VERSION, TOOLSETS, PromptSet
from parser.engine.tools import FunctionTools, TurnRules

PROMPTS = PromptSet(__package__, {"rag_system": set(), "rag_user": {"question"}}, "prompts")


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

    def __init__(self, retriever: Retriever, version: str = DEFAULT_VERSION, rules: TurnRules = TurnRules()):
        self.retriever, self.version, self.rules = retriever, version, rules
        self.functions = {"retrieve_documents": self.retrieve_documents}
        self.tool_schemas = PROMPTS.schemas("retrieve_documents", version=version)

    async def retrieve_documents(self, arguments: dict[str, Any]) -> str:
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            return "Error: retrieve_documents needs a non-empty 'query' string"
        return orjson.dumps({"query": query, "results": self.retriever.search(query)}).decode()

    def system_prompt(self) -> str:
        return PROMPTS.render("rag_system", self.version)

    def user_prompt(self, question: str) -> str:
        return PROMPTS.render("rag_user", self.version, question=question)

    def invalid_action(self, error: str) -> str:
        return TOOLSETS.render("invalid_action", self.version, error=error)


class AgenticRAGMethod:
    name = "rag"

    @property
    def reading(self) -> str:
        return f"cut into {self.chunk_size}-token chunks, embedded; each of the lead's searches retrieves {self.top_k}"

    def __init__(self, models: Models, *, chunk_size: int = 1024, top_k: int = 3, embedder: Mapping[str, Any] | str | None = None,
                 episode: Mapping[str, Any] | None = None, prompt_version: str = DEFAULT_VERSION):
        """`embedder` (this method's config) is used when the models config has none; `episode` is the
        composed section (configs/method/rag.yaml's `episode`; `parser.methods.method_config("rag")["episode"]`)."""
        if models.embedder is None:
            if embedder is None:
                raise ValueError("rag: no embedder: set method.embedder or models.embedder (e.g. {model: minilm})")
            models.embedder = build_embedder(embedder)
        self.models = models
        self.chunk_size, self.top_k, self.prompt_version = chunk_size, top_k, prompt_version
        self.engine, self.rules = baseline_engine(models.lead, models.lead_tokenizer, episode, "rag",
                                                  "configs/method/rag.yaml, parser.methods.method_config('rag')")

    async def run(self, sample: Sample) -> MethodResult:
        started = time.perf_counter()
        chunks = [c.text for c in chunk_document(sample.context, self.models.lead_tokenizer, self.chunk_size)]
        tools = RetrievalTools(Retriever(self.models.embedder, chunks, self.top_k), self.prompt_version, self.rules)
        index_s = time.perf_counter() - started
        trajectory = await self.engine.run_tools(sample.question, tools, doc_id=sample.id)
        trajectory.num_chunks = len(chunks)
        return MethodResult(
            answer=trajectory.answer, steps=trajectory.num_turns, wall_s=time.perf_counter() - started,
            lead_output_tokens=int(trajectory.stats()["lead_tokens"]), trace=dataclasses.replace(trajectory, extras={"index_s": index_s}),
        )

    async def aclose(self) -> None:
        await self.models.aclose()
