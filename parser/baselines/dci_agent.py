"""The standalone DCI agent (paper Appendix D.2): one model searching the document with `rg`/`read`.

The document never enters the conversation: it is written to a temporary corpus directory (one
file per paragraph, `parser.dci.materialize_corpus`) and the agent inspects it only through the
sandboxed `read` and `bash` tools (`parser.dci.Sandbox`). Reference settings: thinking on,
temperature 0, 8,192 new tokens a turn, at most 48 turns, parallel tool calls, cut turns get a
continuation prompt, a reply without tool calls is the answer, older tool results are compacted
past 240,000 characters (the last 12 kept), and a tool-free finalize turn if turns run out.
"""
from __future__ import annotations

import tempfile
import time
from typing import Any, Mapping

from parser.baselines import templates
from parser.baselines.tool_agent import ToolAgent, ToolAgentConfig
from parser.dci import Sandbox, materialize_corpus
from parser.methods import MethodResult, Models, Sample, register_method

DCI_AGENT_DEFAULTS = {
    "max_turns": 48, "max_new_tokens": 8192, "temperature": 0.0, "thinking": True, "plain_reply_is_answer": True,
    "finalize": True, "compact_after_chars": 240_000, "keep_recent_results": 12,
}


def sandbox_tools(sandbox: Sandbox) -> dict[str, Any]:
    async def read(arguments: dict[str, Any]) -> str:
        return await sandbox.call("read", arguments)

    async def bash(arguments: dict[str, Any]) -> str:
        return await sandbox.call("bash", arguments)

    return {"read": read, "bash": bash}


@register_method("dci")
class DCIAgentMethod:
    name = "dci"

    def __init__(self, models: Models, *, layout: str = "paragraphs", command_timeout_s: float = 30.0,
                 workdir: str | None = None, agent: Mapping[str, Any] | None = None):
        self.models = models
        self.layout, self.command_timeout_s, self.workdir = layout, command_timeout_s, workdir
        self.config = ToolAgentConfig(**{**DCI_AGENT_DEFAULTS, **(agent or {})})

    async def run(self, sample: Sample) -> MethodResult:
        started = time.perf_counter()
        version = self.config.prompt_version
        with tempfile.TemporaryDirectory(prefix="dci-corpus-", dir=self.workdir) as directory:
            sandbox = Sandbox(materialize_corpus(sample.context, directory, layout=self.layout), timeout_s=self.command_timeout_s)
            agent = ToolAgent(self.models.lead, self.models.lead_tokenizer, sandbox_tools(sandbox), templates.tools("read", "bash", version=version), self.config)
            run = await agent.run(templates.render("dci_system", version), templates.render("dci_user", version, question=sample.question), request_id=sample.id)
        return MethodResult(
            answer=run.answer, steps=run.steps, wall_s=time.perf_counter() - started, lead_output_tokens=run.output_tokens,
            record={"stop_reason": run.stop_reason, "turns": run.turns, "tool_calls": sum(len(t["calls"]) for t in run.turns)},
        )

    async def aclose(self) -> None:
        await self.models.aclose()
