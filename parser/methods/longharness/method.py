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

    python -m eval.run method=longharness                       # readers, the paper's eval preset
    python -m eval.run --config-name tiny_cpu method=longharness_cpu
    python -m eval.run method=longharness_dci                   # corpus mode (DCI's tools)

Why the round loop is here and not `EpisodeEngine.run_tools`: the engine's loop appends every
observation to the lead's token stream, which is exactly what LongHarness replaces; everything
below the loop — the tool sets, scatter-gather, retries and deadlines, fan-out bounds, backends,
the untrusted-text rule — is the engine's. docs/longharness.md says what is the abstract's and
what is this project's reading.
"""
from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from contextlib import ExitStack
from typing import Any, Mapping

from parser import progress
from parser.backends.base import SamplingParams
from parser.backends.models import Models
from parser.config import EpisodeConfig
from parser.dci import Sandbox, SandboxLimits, SandboxTools, materialize_corpus
from parser.dci_process import ProcessSlots
from parser.episode import EpisodeEngine
from parser.methods.base import MethodResult, Sample
from .acquire import CorpusAcquisition, ReaderAcquisition
from .state import QUESTION, HarnessState
from .update import Update, read_update, render_prompt, update_schema
from parser.protocol import protocol_for
from parser.readers import reader_for_episode
from parser.retry import RetryPolicy
from parser.trajectory import Trajectory, Turn

ACQUISITIONS = ("readers", "corpus")


class LongHarnessMethod:
    name = "longharness"

    def __init__(self, models: Models, *, acquisition: str = "readers", episode: Mapping[str, Any] | None = None,
                 reader: Mapping[str, Any] | None = None, sandbox: Mapping[str, Any] | None = None,
                 state_token_budget: int = 2048, max_update_tokens: int = 384, max_stalls: int = 2,
                 max_conclusions: int = 8, max_quote_chars: int = 240, max_evidence_per_query: int = 4, max_queries_per_round: int = 2,
                 constrain: bool = True, layout: str = "paragraphs", workdir: str | None = None):
        if acquisition not in ACQUISITIONS:
            raise ValueError(f"longharness: acquisition must be one of {ACQUISITIONS}, got {acquisition!r}")
        if min(state_token_budget, max_update_tokens, max_evidence_per_query, max_queries_per_round) < 1:
            raise ValueError("longharness: state_token_budget, max_update_tokens, max_evidence_per_query and "
                             "max_queries_per_round must be >= 1")
        self.models, self.acquisition = models, acquisition
        self.config = EpisodeConfig(**(episode or {}))
        self.protocol = protocol_for(self.config)
        self.budget, self.max_update_tokens, self.constrain = state_token_budget, max_update_tokens, constrain
        self.state_args = {"max_stalls": max_stalls, "max_conclusions": max_conclusions, "max_quote_chars": max_quote_chars}
        self.max_evidence, self.layout, self.workdir = max_evidence_per_query, layout, workdir
        self.tokenizer = models.lead_tokenizer
        self.reader = reader_for_episode(reader, models, self.config, self.protocol) if acquisition == "readers" else None
        self.engine = EpisodeEngine(models.lead, models.lead_tokenizer, self.reader, self.config, self.protocol)
        self.limits = SandboxLimits.from_config(sandbox)
        self.slots = ProcessSlots(self.limits.max_processes)
        self.retry = dataclasses.replace(RetryPolicy.of(self.config), timeout_s=None)  # the backend's own deadline
        self.max_queries = min(max_queries_per_round, self.config.max_tool_calls_per_turn)

    # -- prompts --------------------------------------------------------------------------------
    def _untrusted(self, text: str) -> str:
        return self.protocol.untrusted(text, self.tokenizer)

    def _prompt_ids(self, system: str, question: str, state_text: str) -> tuple[list[int], bool]:
        """The whole prompt: the system prompt, then the question and the state, both untrusted
        (quotes, findings, statements the lead copied from them): never a control token."""
        user = render_prompt("user", question=self._untrusted(question), state=self._untrusted(state_text))
        text = self.tokenizer.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                                  tokenize=False, add_generation_prompt=True,
                                                  enable_thinking=self.config.lead_thinking)
        return self.tokenizer.encode(text, add_special_tokens=False), text.rstrip().endswith("<think>")

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
            trajectory, record = await self.episode(sample, acquirer)
            trajectory.num_chunks = num_chunks
        stats = trajectory.stats()
        calls, failures = int(stats["subagent_calls"]), int(stats["subagent_failures"])
        return MethodResult(
            answer=trajectory.answer, steps=trajectory.num_turns, wall_s=trajectory.wall_s,
            lead_output_tokens=int(stats["lead_tokens"]), subagent_output_tokens=int(stats["subagent_completion_tokens"]),
            record={**trajectory.to_dict(), "longharness": record},
            failed=(f"all {calls} subagent calls failed (first: {trajectory.failures[0]['error']})"
                    if calls and failures == calls else None),
        )

    async def episode(self, sample: Sample, acquirer: Any) -> tuple[Trajectory, dict[str, Any]]:
        started = time.perf_counter()
        state = HarnessState(sample.question, acquirer.sources, **self.state_args)
        system = self._system(acquirer)
        trajectory = Trajectory(question=sample.question, doc_id=sample.id, num_chunks=0, token_view_valid=False,
                                token_view_note="longharness re-renders its prompt from the state each turn",
                                constraints=["json_schema"] if self.constrain else [])
        rounds: list[dict[str, Any]] = []
        max_rounds = self.config.max_turns
        for index in range(max_rounds):
            final = index == max_rounds - 1 or not state.open_ids()
            state_text, hidden = state.fit(lambda s: len(self._prompt_ids(system, sample.question, s)[0]) <= self.budget,
                                           rounds_left=max_rounds - index, final=final)
            prompt, opened = self._prompt_ids(system, sample.question, state_text)
            schema = json.dumps(update_schema(self.max_queries, list(state.conclusions), state.open_ids(),
                                              [e.id for e in state.evidence.values() if e.status == "current"]))
            turn, update, problems = await self._lead_turn(prompt, opened, schema, index, sample.id)
            trajectory.turns.append(turn)
            applied = self._apply(state, update, index, final) if update is not None else {"invalid": True}
            if update is None:
                turn.action_error = "; ".join(problems)
            if applied.get("queries") and not state.answer:
                await self._acquire(state, acquirer, applied["queries"], turn, index)
            rounds.append({"round": index, "prompt_tokens": len(prompt), "hidden": hidden, "problems": problems,
                           "applied": applied, "state": state.snapshot()})
            if state.answer is not None or applied.get("final_answer"):
                trajectory.answer = state.answer or applied.get("final_answer")
                turn.answer = trajectory.answer
            progress.turn_finished(sample.id, turn)  # eval's bar, the demo: the round is recorded
            if turn.answer is not None:
                trajectory.stop_reason = "answer" if state.answer else "final_round"
                break
            if final:
                trajectory.stop_reason = "final_round"
                break
        trajectory.wall_s = time.perf_counter() - started
        record = {"acquisition": self.acquisition, "state_token_budget": self.budget, "rounds": rounds,
                  "answer_cited": state.answer is not None, "answer_evidence": state.answer_evidence,
                  "question_supported": state.supported(QUESTION), "counters": dataclasses.asdict(state.counters)}
        return trajectory, record

    async def _lead_turn(self, prompt: list[int], opened: bool, schema: str, index: int, doc_id: str) -> tuple[Turn, Update | None, list[str]]:
        sampling = SamplingParams(max_new_tokens=self.max_update_tokens, temperature=self.config.lead_temperature,
                                  top_p=self.config.lead_top_p, top_k=self.config.lead_top_k,
                                  json_schema=schema if self.constrain else None)
        started = time.perf_counter()
        completion, attempts = await self.retry.call(lambda: self.models.lead.generate(prompt, sampling, request_id=doc_id))
        ids = list(completion.token_ids) or self.tokenizer.encode(completion.text, add_special_tokens=False)
        text = completion.text or self.tokenizer.decode(ids, skip_special_tokens=False)
        text = self.protocol.chat.strip_end(text)
        update, problems = read_update(text, thinking_open=opened, constrained=self.constrain)
        turn = Turn(index=index, text=text, thinking="", queries=[], answer=None, action_error=None, lead_tokens=len(ids),
                    finish_reason=completion.finish_reason, lead_latency_s=time.perf_counter() - started,
                    prompt_tokens=len(prompt), lead_attempts=attempts)
        return turn, update, problems

    def _apply(self, state: HarnessState, update: Update, index: int, final: bool) -> dict[str, Any]:
        """The update under the lifecycle rules, in a fixed order: retirements, conclusions, the
        answer, then the queries (each to an open conclusion, none asked before for it)."""
        applied: dict[str, Any] = {"retired": [], "conclusions": [], "refused": [], "queries": []}
        for entry in update.retire:
            problem = state.retire(entry["evidence"], entry["status"], by=entry["by"], reason=entry["reason"], round_=index)
            (applied["refused"] if problem else applied["retired"]).append(problem or entry["evidence"])
        aliases: dict[str, str] = {}
        for entry in update.conclusions:
            cid, problem = state.set_conclusion(entry["id"] if entry["id"] in state.conclusions else None, entry["statement"],
                                                entry["status"], entry["evidence"], needs=entry["needs"], round_=index)
            if cid is not None and entry["id"]:
                aliases[entry["id"]] = cid
            if problem:
                applied["refused"].append(f"{entry['id'] or 'new'}: {problem}")
            if cid is not None and (not problem or cid not in applied["conclusions"]):
                applied["conclusions"].append(cid)
        if update.answer:
            if state.give_answer(update.answer, update.answer_evidence, index):
                return applied
            applied["refused"].append(f"answer {update.answer!r} cites no current evidence {update.answer_evidence}")
            if final:
                applied["final_answer"] = update.answer  # the budget is spent: kept, uncited (answer_cited: false)
                return applied
        for entry in update.queries[: self.max_queries]:
            if final:  # nothing acquired now would ever be read
                applied["refused"].append(f"query {entry['query']!r}: the last turn runs no queries")
                continue
            cid = aliases.get(entry["conclusion"], entry["conclusion"])
            if cid not in state.conclusions or state.conclusions[cid].status != "open":
                applied["refused"].append(f"query {entry['query']!r}: {cid or '?'} is not an open conclusion")
            elif state.asked_before(cid, entry["query"]) or any(
                    q["conclusion"] == cid and q["query"] == entry["query"] for q in applied["queries"]):
                applied["refused"].append(f"query {entry['query']!r} was already asked for {cid}")
                state.note_query(cid, entry["query"], [], index)  # a repeat adds nothing new: it counts against its conclusion
            else:
                applied["queries"].append({"conclusion": cid, "query": entry["query"]})
        return applied

    async def _acquire(self, state: HarnessState, acquirer: Any, queries: list[dict[str, str]], turn: Turn, index: int) -> None:
        started = time.perf_counter()
        results = await acquirer.acquire([q["query"] for q in queries])
        turn.scatter_latency_s = time.perf_counter() - started
        for query, result in zip(queries, results, strict=True):
            outcomes = [state.add_evidence(c.source, c.quote, query=query["query"], conclusion=query["conclusion"],
                                           round_=index, answer=c.answer) for c in result.candidates]
            new = [o.split(":", 1)[1] for o in outcomes if o.startswith("added:")]
            state.note_query(query["conclusion"], query["query"], new, index)
            query["outcomes"] = outcomes
            if result.query_record is not None:
                turn.queries.append(result.query_record)
            if result.call_record is not None:
                turn.tool_calls.append(result.call_record)

    async def aclose(self) -> None:
        if self.reader is not None:
            self.reader.close()
        await self.models.aclose()

