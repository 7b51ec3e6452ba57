"""The "parser" method: chunk the document, run the one episode engine, report the result.

Eval, the latency bench and the demo reach ParSer only through this method, and the verl
agent loop runs the same `EpisodeEngine`, so there is a single code path from data to answer.
The protocol object (`parser.engine.protocol`) is chosen once from the episode config and handed to the
chunking, the reader and the engine, exactly as the verl agent loop does, so `method=parser_release`
feeds the released checkpoint the release's own inputs. The chunk reader comes from the `reader`
config section (`parser.engine.readers.reader_for_episode`), so the paper's Table 5 variants are config
files, not code:

    parser eval method=parser            # configs/method/parser.yaml: the default subagents
    parser eval method=parser_thinking   # reader: {_target_: parser.engine.readers.ThinkingReader}
    parser eval method=parser_dci        # reader: {_target_: parser.engine.readers.DCIReader}
    parser eval method=parser_release    # episode.protocol: release
"""
from __future__ import annotations

from typing import Any, Mapping

from parser.base.config import EpisodeConfig
from parser.engine.episode import EpisodeEngine
from parser.serving.backends.models import Models
from parser.methods.base import MethodResult, Sample
from parser.engine.protocol import protocol_for
from parser.engine.readers import reader_for_episode


class ParSerMethod:
    name = "parser"
    reading = "{chunks} chunks, each read by its own subagent"

    def __init__(self, models: Models, episode: Mapping[str, Any] | EpisodeConfig | None = None,
                 reader: Mapping[str, Any] | Any = None):
        """`reader`: a config section (`{_target_: parser.engine.readers.SubagentReader, ...}`, or another reader; the method builds the
        reader and closes it on `aclose`) or a ready `ChunkReader` (the caller closes it)."""
        self.config = episode if isinstance(episode, EpisodeConfig) else EpisodeConfig(**(episode or {}))
        self.protocol = protocol_for(self.config)
        self.models = models
        self.owns_reader = reader is None or isinstance(reader, Mapping)
        if self.owns_reader:
            reader = reader_for_episode(reader, models, self.config, self.protocol)
        self.reader = reader
        self.engine = EpisodeEngine(models.lead, models.lead_tokenizer, self.reader, self.config, self.protocol)

    async def run(self, sample: Sample) -> MethodResult:
        chunks = self.protocol.chunk(sample.context, self.models.subagent_tokenizer)
        try:
            trajectory = await self.engine.run(sample.question, chunks, doc_id=sample.id)
        finally:
            self.reader.forget(sample.id)  # e.g. the DCI reader's per-chunk corpora
        stats = trajectory.stats()
        calls, failures = int(stats["subagent_calls"]), int(stats["subagent_failures"])
        return MethodResult(
            answer=trajectory.answer,
            steps=trajectory.num_turns,
            wall_s=trajectory.wall_s,
            lead_output_tokens=int(stats["lead_tokens"]),
            subagent_output_tokens=int(stats["subagent_completion_tokens"]),
            trace=trajectory,
            failed=(f"all {calls} subagent calls failed (first: {trajectory.failures[0]['error']})"
                    if calls and failures == calls else None),
        )

    async def aclose(self) -> None:
        if self.owns_reader:
            self.reader.close()
        await self.models.aclose()
