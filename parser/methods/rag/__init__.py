"""Agentic RAG (configs/method/rag.yaml): the class, its tool set, its prompts and tool schema (`prompts/`)."""
from parser.methods.rag.method import PROMPTS, AgenticRAGMethod, Retriever, RetrievalTools

__all__ = ["PROMPTS", "AgenticRAGMethod", "Retriever", "RetrievalTools"]
