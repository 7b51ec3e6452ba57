"""Recursive Language Models (RLM, arXiv 2512.24601) as rlms 0.1.3 runs them, on the project's models.

The document lives only in a persistent Python REPL, as `context`; the root model (the lead role)
never sees it in a message. Each iteration the root sees rlms' system prompt (+ the orchestrator
addendum, on by default as in rlms), the metadata message, its own earlier replies with their
REPL output, and "Turn i/N:" (the first with rlms' safeguard); the ```repl blocks of its reply run
in order and their output comes back in rlms' format (`reference.format_iteration`: stdout, stderr,
the variable list, each block cut at 20,000 characters). Code ends the episode by setting
`answer["ready"] = True`; after `max_iterations` iterations without it, rlms' fallback call (the
history plus a request sent as an assistant message) gives the answer. `llm_query` /
`llm_query_batched` (and `rlm_query*`, which at depth 1 fall back to them as in rlms) are sub-calls
on the subagent role: through `parser.serving.retry.RetryingBackend` (retries, per-attempt deadline)
under the method's request slots (`episode.max_concurrency`, as the engine's); one that still fails returns rlms' "Error: ..."
string to the REPL and never ends the episode. Budgets as rlms': `max_iterations` (the episode's `max_turns`), `max_timeout`
(wall seconds), `max_tokens` (input + output of every call, root and sub) and `max_errors`
(consecutive iterations with stderr) each end with rlms' best partial answer (the last non-empty
root reply). Usage is counted per role (rlms merges root and sub usage by model name: docs/fidelity.md).

    parser eval method=rlm                                    # the paper's models, rlms' defaults
    parser eval --config-name tiny_cpu method=rlm_cpu limit=1 runs=1
    parser eval method=rlm method.episode.max_turns=10 method.max_timeout=600    # rlms' max_iterations: 10

The loop is the one episode engine: `turns.RlmTurns` is a tool set with a prompt from state
(`parser.engine.tools.StatePrompt`, as LongHarness), so turns, the root's token budget, retries,
progress events and the trajectory are `EpisodeEngine.run_tools`'s (the root's reply budget is
`episode.max_tokens_per_turn`); the fallback call is the engine's one turn past `episode.max_turns`. What the engine cannot express is
kept out rather than bent in: the answer set by code is known only after `execute`, so it is the
tool set's (`RlmTurns.answer`), which this class puts on the trajectory; the root's history is
re-rendered each turn (the fallback ends on an assistant message), so there is no token view and
the method is eval-only. Model-written code runs only in `parser.engine.sandbox.repl.ReplSandbox`
(a separate, limited process per episode, never this one; docs/security.md). `max_depth > 1`
(child RLMs with their own REPL) is not implemented yet and is refused.

Prompts are rlms' own, read from the installed package (`prompt_source: rlms`, the `peers` extra)
or from a JSON file of its three constants (`reference.load_prompts`); each row records the rlms
version (`record.rlm.rlms_version`).
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Mapping

from parser.base.config import EpisodeConfig
from parser.engine.episode import EpisodeEngine
from parser.engine.protocol import protocol_for
from parser.engine.readers.subagent import render_chat
from parser.engine.sandbox.process import ProcessSlots
from parser.engine.sandbox.repl import ReplLimits, ReplSandbox
from parser.methods.base import MethodResult, Sample
from parser.serving.backends.models import Models
from parser.serving.retry import CallFailed, RetryingBackend, RetryPolicy
from parser.serving.types import SamplingParams
from .reference import MAX_OUTPUT_CHARS, load_prompts
from .turns import RlmTurns, RoleUsage


UNCONSTRAINED = {"constrain_lead": False, "distinct_queries": False, "query_first": False, "answer_last_turn": False}


class RLMMethod:
    name = "rlm"
    reading = "held whole in the REPL, read by the root model's code and its llm_query sub-calls"
    view = "parser.methods.rlm.view:render"  # each iteration's code, output and sub-calls, in eval.viewer

    def __init__(self, models: Models, *, episode: Mapping[str, Any] | None = None, sandbox: Mapping[str, Any] | None = None,
                 max_depth: int = 1, max_timeout: float | None = None, max_tokens: int | None = None,
                 max_errors: int | None = None, orchestrator: bool = True, sub_max_new_tokens: int = 1024,
                 sub_temperature: float = 1.0, sub_thinking: bool = False, prompt_source: str = "rlms"):
        """`sandbox`: `ReplLimits` fields (configs/sandbox/repl.yaml), plus `max_workers` (REPL workers
        alive at once over this method's episodes) and `allow_unisolated` (the named unsafe option)."""
        if max_depth != 1:
            raise ValueError(f"rlm: max_depth={max_depth}: recursion (child RLMs with their own REPL) is not yet "
                             "implemented; max_depth: 1 is rlms' default, where rlm_query falls back to llm_query")
        sandbox = dict(sandbox or {})
        workers, self.allow_unisolated = sandbox.pop("max_workers", 8), sandbox.pop("allow_unisolated", False)
        if not isinstance(self.allow_unisolated, bool):
            raise ValueError(f"rlm: sandbox.allow_unisolated must be true or false, got {self.allow_unisolated!r}")
        for field, value in (("sub_max_new_tokens", sub_max_new_tokens), ("sandbox.max_workers", workers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"rlm: {field} must be a positive integer, got {value!r}")
        for field, value in (("max_timeout", max_timeout), ("max_tokens", max_tokens), ("max_errors", max_errors)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f"rlm: {field} must be positive or null (no limit), got {value!r}")
        self.models, self.prompts = models, load_prompts(prompt_source)
        # the root writes free text with code blocks: the lead constraints of tool-call turns (the CPU
        # preset's) do not apply, as under any prompt from state
        episode = {**(episode or {}), **UNCONSTRAINED}
        # rlms' max_iterations is the episode's turn limit; the engine runs one turn more, the fallback call
        rlms_episode = EpisodeConfig(**episode)
        iterations = rlms_episode.max_turns
        self.config = dataclasses.replace(rlms_episode, max_turns=iterations + 1)
        self.protocol = protocol_for(self.config)
        self.engine = EpisodeEngine(models.lead, models.lead_tokenizer, None, self.config, self.protocol)  # no reader: the REPL reads
        self.limits = ReplLimits(**sandbox)
        if self.limits.output_chars < MAX_OUTPUT_CHARS:  # the head rlms shows must be kept whole
            raise ValueError(f"rlm: sandbox.output_chars={self.limits.output_chars} keeps less of a cell's output than "
                             f"rlms shows; it must be >= {MAX_OUTPUT_CHARS}")
        self.repl_slots, self.request_slots = ProcessSlots(workers), ProcessSlots(self.config.max_concurrency)
        self.subagent = RetryingBackend(models.subagent, RetryPolicy.of(self.config))  # retries, per-attempt deadline
        self.sub_sampling = SamplingParams(max_new_tokens=sub_max_new_tokens, temperature=sub_temperature)
        self.sub_thinking = sub_thinking
        self.budgets = {"max_iterations": iterations, "orchestrator": orchestrator, "max_errors": max_errors,
                        "max_tokens": max_tokens, "max_timeout": max_timeout}

    def _untrusted(self, text: str, tokenizer: Any) -> str:
        return self.protocol.untrusted(text, tokenizer)

    # -- sub-calls (the REPL's llm_query*, on the subagent role) --------------------------------
    def _sub_prompt(self, prompt: str) -> str | list[dict[str, str]]:
        """rlms' sub-call is one user message; a backend whose server renders the template gets it
        as messages, any other the subagent's template rendering."""
        messages = [{"role": "user", "content": self._untrusted(prompt, self.models.subagent_tokenizer)}]
        if self.subagent.renders_chat_template:
            return messages
        return render_chat(self.models.subagent_tokenizer, messages, enable_thinking=self.sub_thinking)

    async def _sub_call(self, prompt: str, doc_id: str, usage: RoleUsage, failures: list[str]) -> str:
        request = self._sub_prompt(prompt)
        try:
            async with self.request_slots():
                completion = await self.subagent.generate(request, self.sub_sampling, routing_key=f"{doc_id}:rlm",
                                                          request_id=doc_id)
        except CallFailed as error:
            failures.append(str(error))
            usage.calls += 1
            return f"Error: LM query failed - {error}"  # rlms' text for a failed llm_query request
        encode = self.models.subagent_tokenizer.encode
        prompt_tokens = completion.prompt_tokens or len(encode(request if isinstance(request, str) else prompt,
                                                               add_special_tokens=False))
        usage.add(prompt_tokens, len(completion.token_ids) or len(encode(completion.text, add_special_tokens=False)))
        return completion.text

    # -- one episode ----------------------------------------------------------------------------
    async def run(self, sample: Sample) -> MethodResult:
        usage = {"root": RoleUsage(), "sub": RoleUsage()}
        failures: list[str] = []

        async def llm(prompts: list[str], model: str | None) -> list[str]:
            """The sandbox's host callback; `model` is recorded by the sandbox, the subagent answers."""
            return list(await asyncio.gather(*(self._sub_call(p, sample.id, usage["sub"], failures) for p in prompts)))

        lead_tokenizer, started = self.models.lead_tokenizer, time.perf_counter()
        async with await ReplSandbox.start(sample.context, llm=llm, limits=self.limits, slots=self.repl_slots,
                                           allow_unisolated=self.allow_unisolated) as repl:
            turns = RlmTurns(self.prompts, sample.question, sample.context, repl,
                             untrusted=lambda text: self._untrusted(text, lead_tokenizer),
                             count_tokens=lambda text: len(lead_tokenizer.encode(text, add_special_tokens=False)),
                             usage=usage, max_blocks=self.config.max_tool_calls_per_turn,
                             prompt_version=self.config.prompt_version, **self.budgets)
            trajectory = await self.engine.run_tools(sample.question, turns, doc_id=sample.id)
        turns.cut_by_engine(trajectory.stop_reason)
        trajectory.answer, trajectory.stop_reason = turns.answer, turns.stop_reason
        sub = usage["sub"]
        return MethodResult(
            answer=turns.answer, steps=trajectory.num_turns, wall_s=time.perf_counter() - started,  # the REPL's start and end too
            lead_output_tokens=int(trajectory.stats()["lead_tokens"]), subagent_output_tokens=sub.output_tokens,
            trace=dataclasses.replace(trajectory, extras={"rlm": turns.trace_part()}),
            failed=(f"all {sub.calls} sub-calls failed (first: {failures[0]})" if sub.calls and len(failures) == sub.calls
                    else None),
        )

    async def aclose(self) -> None:
        await self.models.aclose()
