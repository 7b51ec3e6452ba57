"""The "parser" method: chunk the document, run the one episode engine, report the result.

Eval, the latency bench and the demo reach ParSer only through this method, and the verl
agent loop runs the same `EpisodeEngine`, so there is a single code path from data to answer.
"""
from __future__ import annotations

from typing import Any

from parser.chunking import chunk_document
from parser.episode import EpisodeConfig, EpisodeEngine
from parser.methods import MethodResult, Models, Sample, register_method
from parser.reader import SubagentReader


@register_method("parser")
class ParSerMethod:
    name = "parser"

    def __init__(self, models: Models, episode: dict[str, Any] | EpisodeConfig | None = None, reader: Any = None):
        self.config = episode if isinstance(episode, EpisodeConfig) else EpisodeConfig(**(episode or {}))
        self.models = models
        self.reader = reader or SubagentReader(
            models.subagent,
            models.subagent_tokenizer,
            temperature=self.config.subagent_temperature,
            max_new_tokens=self.config.subagent_max_tokens,
            prompt_version=self.config.prompt_version,
        )
        self.engine = EpisodeEngine(models.lead, models.lead_tokenizer, self.reader, self.config)

    async def run(self, sample: Sample) -> MethodResult:
        chunks = chunk_document(sample.context, self.models.subagent_tokenizer, self.config.chunk_size)
        trajectory = await self.engine.run(sample.question, chunks, doc_id=sample.id)
        stats = trajectory.stats()
        return MethodResult(
            answer=trajectory.answer,
            steps=trajectory.num_turns,
            wall_s=trajectory.wall_s,
            lead_output_tokens=int(stats["lead_tokens"]),
            subagent_output_tokens=int(stats["subagent_completion_tokens"]),
            record=trajectory.to_dict(),
        )

    async def aclose(self) -> None:
        await self.models.aclose()
