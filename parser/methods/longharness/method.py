"""LongHarness: evidence and conclusions as explicit, bounded, traceable state (issue 34).

Each round the lead sees the question and the rendered state (`state.HarnessState`, within
`state_token_budget` prompt tokens, dropping items in its stated eviction order), never the
history, and writes one structured update (`update.read_update`, schema-constrained where the
backend can): conclusions added or revised, evidence retired, queries each serving an open
conclusion, and perhaps the answer with the evidence ids it rests on. The queries run through a
tool set of the one episode engine (`acquire`: ParSer's `query_agents` over the chunks, or DCI's
sandboxed shell over a corpus directory); what comes back is ledgered under the lifecycle rules.
The episode ends on a cited answer, or after `episode.max_turns` rounds (the last round must
answer), or once no conclusion is open (one answer turn). Any backend: no training, no token view.

    parser eval method=longharness                       # readers, the paper's eval preset
    parser eval --config-name tiny_cpu method=longharness_cpu
    parser eval method=longharness_dci                   # corpus mode (DCI's tools)

The rounds are `EpisodeEngine.run_tools`'s turns: `turns.HarnessTurns` is the episode's tool set
and its prompt-from-state turn rule (`parser.engine.tools.StatePrompt`), so the loop, the lead's budget
(`max_update_tokens` is the episode's `max_tokens_per_turn`), retries, fan-out bounds, progress
events and the trajectory are the engine's. This class builds the acquisition and the engine, and
turns the trajectory and the state into the result. docs/longharness.md says what is the
abstract's and what is this project's reading.
"""
from __future__ import annotations

import dataclasses
import tempfile
from contextlib import ExitStack
from typing import Any, Mapping

from parser.serving.backends.models import Models
from parser.base.config import EpisodeConfig
from parser.base.domains import problems
from parser.engine.sandbox.tools import Sandbox, SandboxLimits, SandboxTools, materialize_corpus
from parser.engine.sandbox.process import ProcessSlots
from parser.engine.episode import EpisodeEngine
from parser.methods.base import MethodResult, Sample
from .acquire import CorpusAcquisition, ReaderAcquisition
from .turns import HarnessTurns
from .update import render_prompt
from parser.engine.protocol import protocol_for
from parser.engine.readers import reader_for_episode

ACQUISITIONS = ("readers", "corpus")


class LongHarnessMethod:
    name = "longharness"
    view = "parser.methods.longharness.view:render"  # the state per round, in eval.viewer

    @property
    def reading(self) -> str:
        if self.acquisition == "corpus":
            return "a corpus directory the lead's queries search with DCI's sandboxed tools"
        return "{chunks} chunks, each read by its own subagent for the queries the state asks"

    def __init__(self, models: Models, *, acquisition: str = "readers", episode: Mapping[str, Any] | None = None,
                 reader: Mapping[str, Any] | None = None, sandbox: Mapping[str, Any] | None = None,
                 state_token_budget: int = 2048, max_update_tokens: int = 384, max_stalls: int = 2,
                 max_conclusions: int = 8, max_quote_chars: int = 240, max_evidence_per_query: int = 4, max_queries_per_round: int = 2,
                 constrain: bool = True, layout: str = "paragraphs", workdir: str | None = None):
        if acquisition not in ACQUISITIONS:
            raise ValueError(f"longharness: acquisition must be one of {ACQUISITIONS}, got {acquisition!r}")
        refused = problems({"state_token_budget": state_token_budget, "max_update_tokens": max_update_tokens,
                            "max_stalls": max_stalls, "max_conclusions": max_conclusions, "max_quote_chars": max_quote_chars,
                            "max_evidence_per_query": max_evidence_per_query, "max_queries_per_round": max_queries_per_round},
                           "longharness")
        if refused:  # the declared domains (parser.base.domains); eval, ask and the demo refuse these before loading
            raise ValueError("; ".join(refused))
        self.models, self.acquisition = models, acquisition
        # one update is one engine turn: its token budget is the turn's
        self.config = EpisodeConfig(**{**(episode or {}), "max_tokens_per_turn": max_update_tokens})
        self.protocol = protocol_for(self.config)
        self.budget, self.constrain = state_token_budget, constrain
        self.state_args = {"max_stalls": max_stalls, "max_conclusions": max_conclusions, "max_quote_chars": max_quote_chars}
        self.max_evidence, self.layout, self.workdir = max_evidence_per_query, layout, workdir
        self.tokenizer = models.lead_tokenizer
        self.reader = reader_for_episode(reader, models, self.config, self.protocol) if acquisition == "readers" else None
        self.engine = EpisodeEngine(models.lead, models.lead_tokenizer, self.reader, self.config, self.protocol)
        self.limits = SandboxLimits.from_config(sandbox)
        self.slots = ProcessSlots(self.limits.max_processes)
        self.max_queries = min(max_queries_per_round, self.config.max_tool_calls_per_turn)

    def _system(self, acquirer: Any) -> str:
        commands = ", ".join(a for a in ("grep", "ls", "find", "head", "wc", "rg") if a in acquirer.tools.sandbox.programs) \
            if self.acquisition == "corpus" else ""
        return render_prompt("system", acquisition=render_prompt(acquirer.prompt, commands=commands))

    # -- one episode ----------------------------------------------------------------------------
    async def run(self, sample: Sample) -> MethodResult:
        with ExitStack() as stack:
            if self.acquisition == "readers":
                chunks = self.protocol.chunk(sample.context, self.models.subagent_tokenizer)
                stack.callback(self.reader.forget, sample.id)
                acquirer: Any = ReaderAcquisition(self.engine.query_agents(chunks, sample.id), chunks, self.max_evidence)
                num_chunks = len(chunks)
            else:
                directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="longharness-", dir=self.workdir))
                root = materialize_corpus(sample.context, directory, layout=self.layout)
                tools = SandboxTools(Sandbox(root, self.limits, slots=self.slots), version=self.config.prompt_version)  # its bash only
                acquirer = CorpusAcquisition(tools, root, self.max_evidence)
                num_chunks = len(acquirer.lines)
            turns = HarnessTurns(sample.question, acquirer, system=self._system(acquirer),
                                 untrusted=lambda text: self.protocol.untrusted(text, self.tokenizer), budget=self.budget,
                                 max_queries=self.max_queries, constrain=self.constrain, acquisition=self.acquisition,
                                 **self.state_args)
            trajectory = await self.engine.run_tools(sample.question, turns, doc_id=sample.id)
            trajectory.num_chunks = num_chunks
        stats = trajectory.stats()
        calls, failures = int(stats["subagent_calls"]), int(stats["subagent_failures"])
        return MethodResult(
            answer=trajectory.answer, steps=trajectory.num_turns, wall_s=trajectory.wall_s,
            lead_output_tokens=int(stats["lead_tokens"]), subagent_output_tokens=int(stats["subagent_completion_tokens"]),
            trace=dataclasses.replace(trajectory, extras={"longharness": turns.trace_part()}),
            failed=(f"all {calls} subagent calls failed (first: {trajectory.failures[0]['error']})"
                    if calls and failures == calls else None),
        )

    async def aclose(self) -> None:
        if self.reader is not None:
            self.reader.close()
        await self.models.aclose()
