"""The standalone DCI agent (paper Appendix D.2): one model searching the document with `rg`/`read`.

The document never enters the conversation: it is written to a temporary corpus directory (one
file per paragraph, `parser.dci.materialize_corpus`) and the agent inspects it only through the
sandboxed `read` and `bash` tools (`parser.dci.Sandbox`), the `SandboxTools` tool set below, run
by the one episode engine (`parser.episode`). Reference settings (`DCI_EPISODE`): thinking on,
temperature 0, 8,192 new tokens a turn, at most 48 turns, parallel tool calls, cut turns get a
continuation prompt, a reply without tool calls is the answer, older tool results are compacted
past 240,000 characters (the last 12 kept), and a tool-free finalize turn if turns run out.
Compaction and finalize are eval-only engine options (they re-render history; no token view).

    python -m eval.run method=dci report.row="DCI agent"
"""
from __future__ import annotations

import tempfile
import time
from typing import Any, Mapping

from parser.baselines import templates
from parser.dci import Sandbox, materialize_corpus
from parser.episode import EpisodeConfig, EpisodeEngine
from parser.methods import MethodResult, Models, Sample, register_method
from parser.tools import FunctionTools

DCI_EPISODE = {
    "max_turns": 48, "max_tokens_per_turn": 8192, "lead_temperature": 0.0, "lead_thinking": True,
    "plain_reply_is_answer": True, "continue_cut_turns": True, "finalize_turn": True,
    "compact_after_chars": 240_000, "keep_recent_results": 12,
}


class SandboxTools(FunctionTools):
    """`read(file, offset)` and `bash(command)` confined to one corpus directory.

    `prompt` names the system/user templates: "dci" (the standalone agent, user field
    `question`) or "dci_subagent" (ParSer's DCI reader, user field `query`).
    """

    def __init__(self, sandbox: Sandbox, prompt: str = "dci", version: str = templates.DEFAULT_VERSION):
        self.sandbox, self.prompt, self.version = sandbox, prompt, version
        self.functions = {"read": self.read, "bash": self.bash}
        self.tool_schemas = templates.tools("read", "bash", version=version)

    async def read(self, arguments: dict[str, Any]) -> str:
        return await self.sandbox.call("read", arguments)

    async def bash(self, arguments: dict[str, Any]) -> str:
        return await self.sandbox.call("bash", arguments)

    def system_prompt(self) -> str:
        return templates.render(f"{self.prompt}_system", self.version)

    def user_prompt(self, question: str) -> str:
        field = "query" if self.prompt == "dci_subagent" else "question"
        return templates.render(f"{self.prompt}_user", self.version, **{field: question})

    def invalid_action(self, error: str) -> str:
        return templates.render("invalid_action", self.version, error=error)


@register_method("dci")
class DCIAgentMethod:
    name = "dci"

    def __init__(self, models: Models, *, layout: str = "paragraphs", command_timeout_s: float = 30.0,
                 workdir: str | None = None, episode: Mapping[str, Any] | None = None,
                 prompt_version: str = templates.DEFAULT_VERSION):
        self.models = models
        self.layout, self.command_timeout_s, self.workdir = layout, command_timeout_s, workdir
        self.prompt_version = prompt_version
        self.engine = EpisodeEngine(models.lead, models.lead_tokenizer, config=EpisodeConfig(**{**DCI_EPISODE, **(episode or {})}))

    async def run(self, sample: Sample) -> MethodResult:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="dci-corpus-", dir=self.workdir) as directory:
            sandbox = Sandbox(materialize_corpus(sample.context, directory, layout=self.layout), timeout_s=self.command_timeout_s)
            tools = SandboxTools(sandbox, "dci", self.prompt_version)
            trajectory = await self.engine.run_tools(sample.question, tools, doc_id=sample.id)
        return MethodResult(
            answer=trajectory.answer, steps=trajectory.num_turns, wall_s=time.perf_counter() - started,
            lead_output_tokens=int(trajectory.stats()["lead_tokens"]),
            record={**trajectory.to_dict(), "tool_calls": sum(len(t.tool_calls) for t in trajectory.turns)},
        )

    async def aclose(self) -> None:
        await self.models.aclose()
