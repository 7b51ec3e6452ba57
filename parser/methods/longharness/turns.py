"""One LongHarness episode as a tool set of the one episode engine, with a prompt from state.

`EpisodeEngine.run_tools` owns the loop — turns, the lead's budget, retries and deadlines, the
fan-out bound, progress events, the trajectory. `HarnessTurns` is its tool set and its turn rule
(`parser.engine.tools.StatePrompt`, `TurnRules(state=...)`): before each turn `messages` renders the
question and the state within `state_token_budget` prompt tokens (dropping items in the state's
eviction order); `sampling` is the update's JSON schema, narrowed to this turn's ids; `read`
applies the lead's update under the lifecycle rules and hands back its queries as the turn's
calls (or its answer); `execute` runs them through the acquisition (`acquire`) and ledgers what
comes back; `end_turn` records the round and ends the episode on an answer, or after a final
turn (the engine's last, or one with no conclusion left open).

    turns = HarnessTurns(sample.question, acquirer, system=..., untrusted=..., budget=1024, max_queries=2)
    trajectory = await engine.run_tools(sample.question, turns, doc_id=sample.id)
    part = turns.trace_part()   # the rounds, each with the state after it; the cited answer
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from parser.text.actions import LeadAction, ToolCall, split_thinking
from parser.engine.tools import ToolResult, TurnRules
from .state import QUESTION, HarnessState
from .update import Update, read_update, render_prompt, update_schema

TOOL = "acquire"  # the update's queries, as the turn's calls (the lead itself writes JSON, no tool call)


class HarnessTurns:
    token_view_note = "longharness re-renders its prompt from the state each turn"
    names = (TOOL,)

    def __init__(self, question: str, acquirer: Any, *, system: str, untrusted: Callable[[str], str], budget: int,
                 max_queries: int, constrain: bool = True, acquisition: str = "readers", **state_args: Any):
        self.question, self.acquirer, self.system, self.untrusted = question, acquirer, system, untrusted
        self.budget, self.max_queries, self.constrain, self.acquisition = budget, max_queries, constrain, acquisition
        self.state = HarnessState(question, acquirer.sources, **state_args)
        self.constraints = ["lead: the update's json_schema"] if constrain else []
        self.rules = TurnRules(state=self)
        self.rounds: list[dict[str, Any]] = []
        self.index, self.final, self.round = 0, False, {}

    # -- the tool set ---------------------------------------------------------------------------
    def schemas(self) -> list[dict[str, Any]]:
        return []  # the update is a JSON object, decoded under its schema; the chat template gets no tools

    def system_prompt(self) -> str:
        return self.system

    def user_prompt(self, question: str) -> str:
        """The opening prompt (the state before any round); each turn's is `messages`."""
        return render_prompt("user", question=question, state=self.untrusted(self.state.render()))

    def invalid_action(self, error: str) -> str:
        return error  # never appended: under a prompt from state the next turn sees the state again

    async def execute(self, calls: list[ToolCall]) -> ToolResult:
        """The turn's queries through the acquisition; every candidate goes to the ledger under the
        lifecycle rules. Each call's arguments are its entry in the round's `applied["queries"]`,
        which gains the candidates' outcomes."""
        queries = [call.arguments for call in calls]
        results = await self.acquirer.acquire([q["query"] for q in queries])
        messages, records, call_records = [], [], []
        for query, result in zip(queries, results, strict=True):
            outcomes = [self.state.add_evidence(c.source, c.quote, query=query["query"], conclusion=query["conclusion"],
                                                round_=self.index, answer=c.answer) for c in result.candidates]
            new = [o.split(":", 1)[1] for o in outcomes if o.startswith("added:")]
            self.state.note_query(query["conclusion"], query["query"], new, self.index)
            query["outcomes"] = outcomes
            messages.append({"role": "tool", "name": TOOL, "content": "; ".join(outcomes) or "nothing found"})
            if result.query_record is not None:
                records.append(result.query_record)
            if result.call_record is not None:
                call_records.append(result.call_record)
        return ToolResult(messages, queries=records, calls=call_records)

    # -- the prompt from state (parser.engine.tools.StatePrompt) ----------------------------------------
    def _messages(self, state_text: str) -> list[dict[str, Any]]:
        """The whole prompt: the system prompt, then the question and the state, both untrusted
        (quotes, findings, statements the lead copied from them): never a control token."""
        user = render_prompt("user", question=self.untrusted(self.question), state=self.untrusted(state_text))
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]

    def messages(self, turn_index: int, turns_left: int, measure: Callable[[list[dict[str, Any]]], int]) -> list[dict[str, Any]]:
        self.index, self.final = turn_index, turns_left <= 1 or not self.state.open_ids()
        sizes: list[int] = []

        def fits(text: str) -> bool:
            sizes.append(measure(self._messages(text)))
            return sizes[-1] <= self.budget

        text, hidden = self.state.fit(fits, rounds_left=turns_left, final=self.final)
        self.round = {"round": turn_index, "prompt_tokens": sizes[-1], "hidden": hidden}
        return self._messages(text)

    def sampling(self) -> dict[str, Any]:
        state = self.state
        schema = update_schema(self.max_queries, list(state.conclusions), state.open_ids(),
                               [e.id for e in state.evidence.values() if e.status == "current"])
        return {"json_schema": json.dumps(schema) if self.constrain else None}

    def read(self, text: str, thinking_open: bool) -> LeadAction:
        """The reply as one update, applied; its answer (cited, or kept uncited on a final turn) or its queries."""
        update, problems = read_update(text, thinking_open=thinking_open, constrained=self.constrain, max_queries=self.max_queries)
        applied = self._apply(update) if update is not None else {"invalid": True}
        self.round.update(problems=problems, applied=applied)
        thinking = "" if self.constrain else split_thinking(text, opened=thinking_open)[0]
        answer = self.state.answer or applied.get("final_answer")
        if answer:
            return LeadAction(thinking=thinking, queries=[], answer=answer)
        queries = applied.get("queries", [])
        return LeadAction(thinking=thinking, queries=[q["query"] for q in queries], answer=None,
                          error="; ".join(problems) if update is None else None, calls=[ToolCall(TOOL, q) for q in queries])

    def end_turn(self, answered: bool) -> str | None:
        self.rounds.append({**self.round, "state": self.state.snapshot()})
        if answered:
            return "answer" if self.state.answer else "final_round"
        return "final_round" if self.final else None

    def trace_part(self) -> dict[str, Any]:
        """LongHarness's part of the trajectory's `extras` (`longharness`): the rounds, the cited answer."""
        state = self.state
        return {"acquisition": self.acquisition, "state_token_budget": self.budget, "rounds": self.rounds,
                "answer_cited": state.answer is not None, "answer_evidence": state.answer_evidence,
                "question_supported": state.supported(QUESTION), "counters": dataclasses.asdict(state.counters)}

    # -- the update under the lifecycle rules ---------------------------------------------------
    def _apply(self, update: Update) -> dict[str, Any]:
        """The update under the lifecycle rules, in a fixed order: retirements, conclusions, the
        answer, then the queries (each to an open conclusion, none asked before for it)."""
        state, index, final = self.state, self.index, self.final
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
