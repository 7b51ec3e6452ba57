"""The DCI subagent (paper Table 5): a chunk reader that searches its chunk with `rg`/`read`.

Each chunk is written once to its own corpus directory (one file per paragraph) under a
temporary folder owned by the reader, and every query about that chunk is a short DCI episode of
the one engine (`parser.engine.episode.EpisodeEngine.run_tools` with `SandboxTools`), confined to the
chunk by `parser.engine.sandbox.tools.Sandbox`. The final reply is the same JSON the default subagent gives
(`{"evidence": ..., "answer": ...}` or `{"answer": "unknown"}`), so `parser.engine.gather` and the lead
are unchanged.

    reader = build_reader({"_target_": "parser.engine.readers.DCIReader", "episode": episode_section("dci_reader")}, models)
    parser eval method=parser_dci
"""
from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

from parser.engine import prompts
from parser.serving.types import Backend
from parser.text.chunking import Chunk
from parser.engine.sandbox.tools import ProcessSlots, Sandbox, SandboxLimits, SandboxTools, materialize_corpus
from parser.engine.episode import baseline_engine
from parser.engine.tools import ReaderReply

class DCIReader:
    """`sandbox` holds the `SandboxLimits` of every chunk's sandbox; `sandbox.max_processes`
    bounds the commands running at once over *all* chunks (one scatter round reads them all)."""

    kind = "dci"  # what `Protocol.check_reader` is asked

    @staticmethod
    def episode_defaults(episode: Any, protocol: Any) -> dict[str, Any]:
        """None: its agent runs its own episode section (`reader.episode`, configs/episode/dci_reader.yaml)."""
        return {}

    def __init__(self, backend: Backend, tokenizer: Any, *, sandbox: Mapping[str, Any] | None = None, workdir: str | None = None,
                 episode: Mapping[str, Any] | None = None, prompt_version: str = prompts.DEFAULT_VERSION):
        self.limits = SandboxLimits.from_config(sandbox)
        self.slots = ProcessSlots(self.limits.max_processes)
        self.prompt_version = prompt_version
        self.engine, self.rules = baseline_engine(backend, tokenizer, episode, "dci_reader",
                                                  "configs/method/parser_dci.yaml's reader.episode, or "
                                                  "parser.base.config.episode_section('dci_reader')")
        self.root = Path(tempfile.mkdtemp(prefix="dci-chunks-", dir=workdir))
        self._sandboxes: dict[tuple[str, int], Sandbox] = {}

    def sandbox(self, chunk: Chunk, doc_id: str) -> Sandbox:
        key = (doc_id, chunk.index)
        if key not in self._sandboxes:
            name = f"{hashlib.sha1(doc_id.encode()).hexdigest()[:16]}_{chunk.index:05d}"
            directory = materialize_corpus(chunk.text, self.root / name)
            self._sandboxes[key] = Sandbox(directory, self.limits, slots=self.slots)
        return self._sandboxes[key]

    async def read(self, query: str, chunk: Chunk, doc_id: str) -> ReaderReply:
        tools = SandboxTools(self.sandbox(chunk, doc_id), "dci_subagent", self.prompt_version, self.rules)
        key = f"{doc_id}:{chunk.index}"
        trajectory = await self.engine.run_tools(query, tools, doc_id=key, routing_key=key)
        return ReaderReply(trajectory.answer or "", prompt_tokens=sum(t.prompt_tokens for t in trajectory.turns),
                           completion_tokens=sum(t.lead_tokens for t in trajectory.turns))

    def forget(self, doc_id: str) -> None:
        """Delete one document's chunk corpora (call when its episode is over)."""
        for key in [k for k in self._sandboxes if k[0] == doc_id]:
            shutil.rmtree(self._sandboxes.pop(key).root, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self._sandboxes.clear()
