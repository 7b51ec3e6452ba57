"""The DCI subagent (paper Table 5): a chunk reader that searches its chunk with `rg`/`read`.

Each chunk is written once to its own corpus directory (one file per paragraph) under a
temporary folder owned by the reader, and every query about that chunk runs a short DCI tool
loop (`parser.baselines.tool_agent`) confined to it by `parser.dci.Sandbox`. The final reply is
the same JSON the default subagent gives (`{"evidence": ..., "answer": ...}` or
`{"answer": "unknown"}`), so `parser.gather` and the lead are unchanged.

    reader = DCIReader(models.subagent, models.subagent_tokenizer)
    method = build_method("parser", models=models, episode=..., reader=reader)
"""
from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

from parser.backends.base import Backend
from parser.baselines import templates
from parser.baselines.dci_agent import sandbox_tools
from parser.baselines.tool_agent import ToolAgent, ToolAgentConfig
from parser.chunking import Chunk
from parser.dci import Sandbox, materialize_corpus
from parser.reader import ReaderReply

DCI_READER_DEFAULTS = {
    "max_turns": 8, "max_new_tokens": 2048, "temperature": 0.0, "thinking": False, "plain_reply_is_answer": True,
    "finalize": True, "compact_after_chars": 240_000, "keep_recent_results": 12,
}


class DCIReader:
    def __init__(self, backend: Backend, tokenizer: Any, *, command_timeout_s: float = 30.0, workdir: str | None = None,
                 agent: Mapping[str, Any] | None = None):
        self.backend, self.tokenizer = backend, tokenizer
        self.command_timeout_s = command_timeout_s
        self.config = ToolAgentConfig(**{**DCI_READER_DEFAULTS, **(agent or {})})
        self.root = Path(tempfile.mkdtemp(prefix="dci-chunks-", dir=workdir))
        self._sandboxes: dict[tuple[str, int], Sandbox] = {}

    def sandbox(self, chunk: Chunk, doc_id: str) -> Sandbox:
        key = (doc_id, chunk.index)
        if key not in self._sandboxes:
            name = f"{hashlib.sha1(doc_id.encode()).hexdigest()[:16]}_{chunk.index:05d}"
            directory = materialize_corpus(chunk.text, self.root / name)
            self._sandboxes[key] = Sandbox(directory, timeout_s=self.command_timeout_s)
        return self._sandboxes[key]

    async def read(self, query: str, chunk: Chunk, doc_id: str) -> ReaderReply:
        version = self.config.prompt_version
        agent = ToolAgent(self.backend, self.tokenizer, sandbox_tools(self.sandbox(chunk, doc_id)),
                          templates.tools("read", "bash", version=version), self.config)
        run = await agent.run(templates.render("dci_subagent_system", version), templates.render("dci_subagent_user", version, query=query),
                              request_id=f"{doc_id}:{chunk.index}")
        return ReaderReply(run.answer or "", prompt_tokens=run.prompt_tokens, completion_tokens=run.output_tokens)

    def forget(self, doc_id: str) -> None:
        """Delete one document's chunk corpora (call when its episode is over)."""
        for key in [k for k in self._sandboxes if k[0] == doc_id]:
            shutil.rmtree(self._sandboxes.pop(key).root, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self._sandboxes.clear()
