"""The default chunk reader: the paper's frozen subagent.

`SubagentReader` is the paper's frozen subagent: a non-thinking chat model that
sees fixed instructions, its chunk, then the query (that order keeps instructions+chunk an
identical prefix across rounds, so SGLang's RadixCache — or the CPU backend's prefix cache —
reuses it; `routing_key` = "doc_id:chunk_index" lets the gateway pin the chunk to one worker).
Alternative readers (a thinking subagent, a DCI agent; paper Table 5) implement the same
`parser.engine.tools.ChunkReader` protocol and plug into the same episode engine. The chunk and the
query (which the lead wrote) pass `Protocol.untrusted` before they are rendered.

The user message is the episode protocol's (`parser.engine.protocol`): this project's template, or
under `release` the release's own prompt (loaded from a checkout). The release also sends SGLang
stop strings ("unknown", ...) and drops a reply that hits one; here the reply is generated in
full and `parser.engine.gather` drops it for containing one — the same verdict, and no backend has to
report which stop string matched.
"""
from __future__ import annotations

import functools
from typing import Any

from parser.engine import prompts
from parser.serving.types import Backend, SamplingParams
from parser.text.chunking import Chunk
from parser.base.config import EpisodeConfig
from parser.engine.protocol import Protocol, protocol_for
from parser.engine.tools import ReaderReply


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], **template_kwargs: Any) -> str:
    """Chat-template text with the generation prompt; `enable_thinking` etc. pass through."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)


class SubagentReader:
    """The frozen subagent of the paper, over any `Backend` (gateway, in-process model, ...)."""

    kind = "subagent"  # what `Protocol.check_reader` is asked (the release protocol has only this reader)

    @staticmethod
    def episode_defaults(episode: EpisodeConfig, protocol: Protocol) -> dict[str, Any]:
        """The episode config's subagent settings (temperature, reply budget, prompt version, JSON
        constraint) and the protocol whose subagent prompt it renders, as this reader's defaults."""
        return {"temperature": episode.subagent_temperature, "max_new_tokens": episode.subagent_max_tokens,
                "prompt_version": episode.prompt_version, "protocol": protocol,
                "json_constrained": episode.constrain_subagents}

    def __init__(
        self,
        backend: Backend,
        tokenizer: Any,
        *,
        temperature: float = 0.7,
        max_new_tokens: int = 512,
        thinking: bool = False,
        json_constrained: bool = False,
        prompt_version: str = prompts.DEFAULT_VERSION,
        protocol: Protocol | None = None,
    ):
        """`json_constrained`: ask the server to decode the reply under the finding's JSON
        schema (`prompts/<version>/subagent_schema.json`); SGLang needs a grammar backend.
        `protocol`: the episode's (whose prompt); None is this project's at `prompt_version`."""
        self.backend = backend
        self.tokenizer = tokenizer
        schema = prompts.LEAD.path(prompt_version, "subagent_schema.json").read_text(encoding="utf-8") if json_constrained else None
        self.sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, json_schema=schema)
        self.thinking = thinking
        self.protocol = protocol or protocol_for(EpisodeConfig(prompt_version=prompt_version))
        # A scatter round renders T prompts that differ from last round's only in the query, so
        # each chunk's template frame is rendered once and reused (a render is ~0.25 ms: 0.4 s of
        # client CPU per query at T = 1,750).
        self._frame = functools.lru_cache(maxsize=16_384)(self._render_frame)

    def messages(self, query: str, chunk_text: str) -> list[dict[str, str]]:
        untrusted = functools.partial(self.protocol.untrusted, tokenizer=self.tokenizer)
        return [{"role": "user", "content": self.protocol.subagent_prompt(untrusted(chunk_text), untrusted(query))}]

    def _render(self, query: str, chunk_text: str) -> str:
        return render_chat(self.tokenizer, self.messages(query, chunk_text), enable_thinking=self.thinking)

    def _render_frame(self, chunk_text: str) -> tuple[str, str] | None:
        """(text before the query, text after it), or None if the template does not place the
        query verbatim (then every prompt is rendered in full)."""
        probes = ("\u2063q\u2063", "\u2063probe two\u2063")
        frames = {tuple(self._render(p, chunk_text).split(p)) for p in probes}
        frame = frames.pop()
        return frame if not frames and len(frame) == 2 else None

    def prompt(self, query: str, chunk: Chunk) -> str | list[dict[str, str]]:
        """Rendered text, or the chat messages for a backend whose server renders the template
        (OpenAI chat; `thinking` then travels in the backend's `chat_template_kwargs`)."""
        if getattr(self.backend, "renders_chat_template", False):
            return self.messages(query, chunk.text)
        frame = self._frame(chunk.text)
        return frame[0] + self.protocol.untrusted(query, self.tokenizer) + frame[1] if frame else self._render(query, chunk.text)

    async def read(self, query: str, chunk: Chunk, doc_id: str) -> ReaderReply:
        completion = await self.backend.generate(
            self.prompt(query, chunk), self.sampling, routing_key=f"{doc_id}:{chunk.index}"
        )
        completion_tokens = len(completion.token_ids) or len(self.tokenizer.encode(completion.text, add_special_tokens=False))
        return ReaderReply(completion.text, completion.prompt_tokens, completion_tokens, completion.cached_tokens)

    def forget(self, doc_id: str) -> None:
        """Nothing per document: the frame cache is keyed by chunk text and bounded."""

    def close(self) -> None:
        self._frame.cache_clear()
