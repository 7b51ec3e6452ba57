"""One RLM episode as a tool set of the one episode engine, with a prompt from state.

`EpisodeEngine.run_tools` owns the loop — turns, the root's budget, retries and deadlines, the
fan-out bound, progress events, the trajectory. `RlmTurns` is its tool set and its turn rule
(`parser.engine.tools.StatePrompt`, as LongHarness's `HarnessTurns`): the state is rlms' message
history, which only grows, as `RLM.completion` grows it. Before each iteration `messages` appends
"Turn i/N:" and hands the history over (every message but the system prompt passes `untrusted`:
never a control token of the chat template); `read` finds the reply's ```repl blocks (rlms'
`find_code_blocks`) and returns them as the turn's calls; `execute` runs them in order in the
episode's REPL sandbox; `end_turn` applies `RLM._check_iteration_limits` and the answer check in
rlms' order, appends `format_iteration`'s messages, and says when the episode ends. After
`max_iterations` iterations without an answer the engine's next (last) turn is rlms' fallback
(`_default_answer`): the history plus the fallback request as an assistant message, whose reply
is the answer.

    turns = RlmTurns(prompts, question, context, repl, untrusted=..., count_tokens=..., max_iterations=30)
    trajectory = await engine.run_tools(question, turns, doc_id=sample.id)   # max_turns = max_iterations + 1
    turns.answer, turns.stop_reason, turns.trace_part()
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from parser.engine.tools import ToolResult, TurnRules, not_run
from parser.text.actions import LeadAction, ToolCall, split_thinking
from .reference import CellOutput, Prompts, fallback_messages, find_code_blocks, format_execution_result, format_iteration

TOOL = "repl"  # one ```repl block, as one call of the turn


@dataclasses.dataclass
class RoleUsage:
    """Calls and tokens of one role (root or sub), counted apart (rlms merges them by model name)."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    def add(self, input_tokens: int, output_tokens: int) -> None:
        self.calls += 1
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens


class RlmTurns:
    token_view_note = "rlm renders its prompt from rlms' message history each turn (an assistant-ended fallback)"
    names = (TOOL,)
    constraints: list[str] = []  # the root writes free text: rlms constrains nothing

    def __init__(self, prompts: Prompts, question: str, context: str, repl: Any, *, untrusted: Callable[[str], str],
                 count_tokens: Callable[[str], int], usage: dict[str, RoleUsage], max_iterations: int = 30,
                 orchestrator: bool = True, max_errors: int | None = None, max_tokens: int | None = None,
                 max_timeout: float | None = None, max_blocks: int = 16, prompt_version: str = "v1"):
        self.prompts, self.repl, self.untrusted, self.count_tokens = prompts, repl, untrusted, count_tokens
        self.max_iterations, self.max_blocks, self.prompt_version = max_iterations, max_blocks, prompt_version
        self.max_errors, self.max_tokens, self.max_timeout = max_errors, max_tokens, max_timeout
        self.usage = usage
        self.history = prompts.opening(context, question, orchestrator)
        self.rules = TurnRules(state=self)
        self.started = time.perf_counter()
        self.iterations: list[dict[str, Any]] = []
        self.answer: str | None = None
        self.best_partial: str | None = None  # rlms' `_best_partial_answer`: the last non-empty reply
        self.stop_reason: str | None = None  # set when the episode ends here (answer, fallback, a limit)
        self.consecutive_errors = 0
        self.index, self.current, self.blocks, self.results = 0, {}, [], []

    @property
    def fallback(self) -> bool:
        """This turn is rlms' fallback answer call (every iteration spent without an answer)."""
        return self.index >= self.max_iterations

    # -- the tool set ---------------------------------------------------------------------------
    def schemas(self) -> list[dict[str, Any]]:
        return []  # code blocks in free text; the chat template gets no tools

    def system_prompt(self) -> str:
        return self.history[0]["content"]

    def user_prompt(self, question: str) -> str:
        return self.history[1]["content"]  # the metadata message; every turn's prompt is `messages`

    def invalid_action(self, error: str) -> str:
        return error  # never appended: a reply without a block is an iteration like any other

    async def execute(self, calls: list[ToolCall]) -> ToolResult:
        """The turn's blocks in order, in the one REPL of the episode (rlms runs every block, even
        after one set the answer)."""
        messages, records = [], []
        for call in calls:
            cell = await self.repl.run(call.arguments["code"])
            output = CellOutput(cell.stdout, cell.stderr, cell.variables, cell.stdout_chars, cell.stderr_chars)
            self.results.append(output)
            record = {"code": call.arguments["code"], "stdout": cell.stdout, "stderr": cell.stderr,
                      "variables": list(cell.variables), "final_answer": cell.final_answer, "seconds": round(cell.seconds, 4),
                      "lost_state": cell.lost_state,
                      "sub_calls": [{"prompts": list(s.prompts), "model": s.model, "replies": list(s.replies)}
                                    for s in cell.sub_calls]}
            self.current["blocks"].append(record)
            messages.append({"role": "tool", "name": TOOL, "content": format_execution_result(output)})
            records.append({"name": TOOL, "final_answer": cell.final_answer is not None, "error": bool(cell.stderr),
                            "sub_calls": sum(len(s.prompts) for s in cell.sub_calls), "seconds": round(cell.seconds, 4)})
        return ToolResult(messages, calls=records)

    # -- the prompt from state (parser.engine.tools.StatePrompt) ----------------------------------------
    def messages(self, turn_index: int, turns_left: int, measure: Callable[[list[dict[str, Any]]], int]) -> list[dict[str, Any]]:
        self.index, self.blocks, self.results = turn_index, [], []
        if self.fallback:
            raw = fallback_messages(self.history)
        else:
            self.history.append(self.prompts.turn(turn_index, self.max_iterations))
            raw = self.history
        shown = [raw[0]] + [{**m, "content": self.untrusted(m["content"])} for m in raw[1:]]
        self.current = {"iteration": turn_index, "fallback": self.fallback, "prompt_tokens": measure(shown), "blocks": []}
        return shown

    def sampling(self) -> dict[str, Any]:
        return {}

    def read(self, text: str, thinking_open: bool) -> LeadAction:
        """The reply (its content, as a chat server returns it: thinking apart) -> its blocks as the
        turn's calls, or, on the fallback turn, the answer."""
        thinking, response = split_thinking(text, opened=thinking_open)
        response = response.lstrip() if thinking else response
        self.usage["root"].add(self.current["prompt_tokens"], self.count_tokens(text))
        self.current.update(response=response, thinking=thinking)
        if self.fallback:
            return LeadAction(thinking=thinking, queries=[], answer=response)
        self.blocks = find_code_blocks(response)
        return LeadAction(thinking=thinking, queries=[], answer=None,
                          calls=[ToolCall(TOOL, {"code": code}) for code in self.blocks])

    def end_turn(self, answered: bool) -> str | None:
        """rlms' order after an iteration: the consecutive-error and token limits, then the answer
        (the first block that set it), then the best partial answer, then the history grows; the
        wall-time limit is checked before the next iteration."""
        self.iterations.append(self.current)
        if answered:  # the fallback call's reply is the answer
            self.answer, self.stop_reason = self.current["response"], "fallback"
            return "fallback"
        response, ran = self.current["response"], self.results
        for _ in self.blocks[len(ran):]:  # past the engine's fan-out bound: not run, and the root is told
            refusal = not_run(len(self.blocks), self.max_blocks, self.prompt_version)
            ran = ran + [CellOutput("", refusal, ())]
        self.consecutive_errors = self.consecutive_errors + 1 if any(r.stderr for r in ran) else 0
        if self.max_errors is not None and self.consecutive_errors >= self.max_errors:
            return self._stop("max_errors")
        if self.max_tokens is not None and self.tokens_used() > self.max_tokens:
            return self._stop("max_tokens")
        answers = [b["final_answer"] for b in self.current["blocks"] if b["final_answer"] is not None]
        if answers:
            self.answer, self.stop_reason = answers[0], "answer"
            return "answer"
        if response and response.strip():
            self.best_partial = response
        self.history += format_iteration(response, ran)
        last = self.index + 1 >= self.max_iterations
        if not last and self.max_timeout is not None and time.perf_counter() - self.started > self.max_timeout:
            return self._stop("max_timeout")
        return None  # the engine's next turn: the next iteration, or after the last one the fallback call

    def _stop(self, reason: str) -> str:
        self.answer, self.stop_reason = self.best_partial, reason
        return reason

    def cut_by_engine(self, reason: str) -> None:
        """The engine ended the episode first (its response budget, an empty generation): as at a
        limit, the best partial answer."""
        if self.stop_reason is None:
            self._stop(reason)

    def tokens_used(self) -> int:
        return sum(u.input_tokens + u.output_tokens for u in self.usage.values())

    def trace_part(self) -> dict[str, Any]:
        """RLM's part of the trajectory's `extras` (`rlm`): each iteration's prompt size, reply and
        blocks (code, stdout, stderr, variables, sub-calls); the usage per role; the stop reason;
        the rlms version whose prompts ran."""
        return {"rlms_version": self.prompts.version, "prompt_source": self.prompts.source,
                "max_iterations": self.max_iterations, "stop_reason": self.stop_reason, "answer": self.answer,
                "best_partial_answer": self.best_partial, "iterations": self.iterations,
                "usage": {role: dataclasses.asdict(u) for role, u in self.usage.items()}}
