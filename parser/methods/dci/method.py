"""The standalone DCI agent (paper Appendix D.2): one model searching the document with `rg`/`read`.

The document never enters the conversation: it is written to a temporary corpus directory (one
file per paragraph, `parser.engine.sandbox.tools.materialize_corpus`) and the agent inspects it only through the
sandboxed `read` and `bash` tools (`parser.engine.sandbox.tools.Sandbox`), the `SandboxTools` tool set below, run
by the one episode engine (`parser.engine.episode`). Reference settings (`configs/episode/dci.yaml`):
thinking on, temperature 0, 8,192 new tokens a turn, at most 48 turns, parallel tool calls, cut
turns get a continuation prompt, a reply without tool calls is the answer, older tool results are
compacted past 240,000 characters (the last 12 kept), and a tool-free finalize turn if turns run
out. These turn rules are the DCI tool set's (`parser.engine.tools.TurnRules`, the preset's
`turn_rules:`, composed into this method's `episode` section by configs/method/dci.yaml);
compaction and finalize are eval-only (they re-render history; no token view). Its system and
user prompts are `prompts/v1/dci_*.txt` beside this file; the `read`/`bash` schemas are the
sandbox's (`parser.engine.sandbox.tools`, shared with ParSer's DCI reader).

    parser eval method=dci
"""
from __future__ import annotations

import dataclasses
import tempfile
import time
from typing import Any, Mapping

from parser.engine.sandbox.tools import ProcessSlots, Sandbox, SandboxLimits, SandboxTools, materialize_corpus
from parser.engine.episode import baseline_engine
from parser.serving.backends.models import Models
from parser.methods.base import MethodResult, Sample
from parser.engine.prompts import DEFAULT_VERSION, PromptSet

PROMPTS = PromptSet(__package__, {"dci_system": set(), "dci_user": {"question"}}, "prompts")


class DCIAgentMethod:
    name = "dci"
    reading = "a corpus directory the agent searches with its sandboxed read and bash tools"

    def __init__(self, models: Models, *, layout: str = "paragraphs", sandbox: Mapping[str, Any] | None = None,
                 workdir: str | None = None, episode: Mapping[str, Any] | None = None,
                 prompt_version: str = DEFAULT_VERSION):
        """`episode` is the composed section (configs/episode/dci.yaml + overrides; `parser.base.config.episode_section("dci")`)."""
        self.models = models
        self.layout, self.workdir = layout, workdir
        self.limits = SandboxLimits.from_config(sandbox)  # every sample's sandbox; max_processes over all of them
        self.slots = ProcessSlots(self.limits.max_processes)
        self.prompt_version = prompt_version
        self.engine, self.rules = baseline_engine(models.lead, models.lead_tokenizer, episode, "dci",
                                                  "configs/method/dci.yaml, parser.base.config.episode_section('dci')")

    async def run(self, sample: Sample) -> MethodResult:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="dci-corpus-", dir=self.workdir) as directory:
            sandbox = Sandbox(materialize_corpus(sample.context, directory, layout=self.layout), self.limits, slots=self.slots)
            tools = SandboxTools(sandbox, "dci", self.prompt_version, self.rules, templates=PROMPTS)
            trajectory = await self.engine.run_tools(sample.question, tools, doc_id=sample.id)
        return MethodResult(
            answer=trajectory.answer, steps=trajectory.num_turns, wall_s=time.perf_counter() - started,
            lead_output_tokens=int(trajectory.stats()["lead_tokens"]),
            trace=dataclasses.replace(trajectory, extras={"tool_calls": sum(len(t.tool_calls) for t in trajectory.turns)}),
        )

    async def aclose(self) -> None:
        await self.models.aclose()
