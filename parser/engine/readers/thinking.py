"""The thinking subagent (paper Table 5): the default subagent's prompt, with thinking enabled.

Same instructions, chunk and query as `parser.engine.readers.subagent.SubagentReader` (so the same lead
coordinates it without retraining), but the model reasons first. Only the part after the last
`</think>` is handed to gather — the reasoning often contains braces and guesses that the
lenient JSON parser would otherwise pick up. A reply whose thinking was cut at the token limit
(no `</think>`) is an abstention. Thinking needs a larger budget than the direct reader.
"""
from __future__ import annotations

from typing import Any

from parser.engine import prompts
from parser.text.actions import split_thinking
from parser.serving.types import Backend
from parser.text.chat_format import CHATML
from parser.text.chunking import Chunk
from parser.engine.readers.subagent import SubagentReader
from parser.engine.tools import ReaderReply


class ThinkingReader:
    kind = "thinking"  # what `Protocol.check_reader` is asked

    @staticmethod
    def episode_defaults(episode: Any, protocol: Any) -> dict[str, Any]:
        """None: it samples as a thinking model (its own temperature and budget), not as the
        episode's direct subagent."""
        return {}

    def __init__(self, backend: Backend, tokenizer: Any, *, temperature: float = 0.6, max_new_tokens: int = 4096,
                 prompt_version: str = prompts.DEFAULT_VERSION):
        self.inner = SubagentReader(backend, tokenizer, temperature=temperature, max_new_tokens=max_new_tokens,
                                    thinking=True, prompt_version=prompt_version)

    async def read(self, query: str, chunk: Chunk, doc_id: str) -> ReaderReply:
        reply = await self.inner.read(query, chunk, doc_id)
        if "</think>" not in reply.text:  # still thinking at the limit: nothing usable
            reply.text = ""
        else:
            reply.text = CHATML.strip_end(split_thinking(reply.text)[1]).strip()
        return reply

    def forget(self, doc_id: str) -> None:
        self.inner.forget(doc_id)

    def close(self) -> None:
        self.inner.close()
