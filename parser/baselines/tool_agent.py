"""A small ReAct tool loop for the tool-using baselines (agentic RAG, the DCI agent and the DCI
subagent), pending a pluggable tool set in `parser.episode.EpisodeEngine`.

Why not the episode engine: today it knows exactly one tool, `query_agents`, scattered to chunk
readers. These agents call other tools (`retrieve_documents`, `read`, `bash`) with other
arguments. Until the engine takes a tool set, this loop is the one stand-in — kept small, eval
only (no token view: histories are re-rendered by the chat template each turn, exactly what a
chat-completions server does for the reference implementations). Tool calls are read with the
same dialects as the lead's (`parser.actions`: Qwen3.5 XML and Hermes JSON).

One turn: generate -> an `<answer>` ends the run; tool calls run concurrently and each result
becomes a `tool` message; a response with neither ends the run when `plain_reply_is_answer`
(DCI: "when the model stops without tool calls, its response is the answer"), else gets a hint.
A turn cut at the token limit gets a continuation prompt. When cumulative tool output passes
`compact_after_chars`, older results are replaced by a placeholder, keeping the last
`keep_recent_results` (DCI's zero-LLM "L3" compaction). After `max_turns` without an answer, one
tool-free finalize turn asks for the answer from what was gathered.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Awaitable, Callable

import json_repair
import orjson

from parser.actions import _ANSWER, _TOOL_CALL, _XML_FUNCTION, _XML_PARAMETER, split_thinking
from parser.backends.base import Backend, SamplingParams
from parser.baselines import templates

ToolFn = Callable[[dict[str, Any]], Awaitable[str]]
END_OF_TURN = "<|im_end|>"


@dataclasses.dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclasses.dataclass
class ParsedTurn:
    thinking: str
    content: str  # the response after thinking
    calls: list[ToolCall]
    answer: str | None
    error: str | None


def _parse_call(body: str, closed: bool) -> tuple[ToolCall | None, str | None]:
    function = _XML_FUNCTION.search(body)
    if function:
        params: dict[str, Any] = {k.strip(): v.strip("\n") for k, v in _XML_PARAMETER.findall(function.group(2))}
        return ToolCall(function.group(1).strip(), params), None
    stripped = body.strip()
    if not stripped.startswith("{"):
        return None, "tool call is neither XML nor JSON"
    try:
        call = json_repair.loads(stripped) if closed else orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return None, "truncated tool call"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None, "tool call JSON has no 'name'"
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = json_repair.loads(arguments)
    if not isinstance(arguments, dict):
        return None, "tool call arguments are not an object"
    return ToolCall(call["name"], arguments), None


def parse_turn(text: str) -> ParsedTurn:
    """Thinking, tool calls (any name, any arguments) and/or the last `<answer>`. Never raises."""
    thinking, content = split_thinking(text)
    answers = _ANSWER.findall(content)
    if answers:
        return ParsedTurn(thinking, content, [], answers[-1].strip(), None)
    calls, problems = [], []
    for match in _TOOL_CALL.finditer(content):
        call, problem = _parse_call(match.group(1), closed=match.group(0).endswith("</tool_call>"))
        if call:
            calls.append(call)
        else:
            problems.append(problem)
    error = "; ".join(p for p in problems if p) or None
    return ParsedTurn(thinking, content, calls, None, None if calls else error)


@dataclasses.dataclass
class ToolAgentConfig:
    max_turns: int = 16
    max_new_tokens: int = 2048
    temperature: float = 0.0
    top_p: float = 1.0
    thinking: bool = True
    plain_reply_is_answer: bool = False  # DCI: a reply without tool calls is the answer
    finalize: bool = True  # one tool-free turn after max_turns
    compact_after_chars: int | None = None  # DCI: 240,000
    keep_recent_results: int = 12
    prompt_version: str = templates.DEFAULT_VERSION


@dataclasses.dataclass
class ToolRun:
    answer: str | None
    stop_reason: str  # "answer" | "plain_reply" | "finalize" | "max_turns"
    steps: int  # model generations on the critical path
    output_tokens: int
    prompt_tokens: int
    wall_s: float
    turns: list[dict[str, Any]]
    messages: list[dict[str, Any]]


class ToolAgent:
    def __init__(self, backend: Backend, tokenizer: Any, tools: dict[str, ToolFn], schemas: list[dict[str, Any]], config: ToolAgentConfig):
        self.backend = backend
        self.tokenizer = tokenizer
        self.tools = tools
        self.schemas = schemas
        self.config = config

    def _render(self, messages: list[dict[str, Any]], with_tools: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.schemas if with_tools else None, tokenize=False,
            add_generation_prompt=True, enable_thinking=self.config.thinking,
        )

    async def _generate(self, messages: list[dict[str, Any]], request_id: str | None, with_tools: bool = True) -> tuple[str, int, int, str, float]:
        cfg = self.config
        sampling = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
        started = time.perf_counter()
        completion = await self.backend.generate(self._render(messages, with_tools), sampling, request_id=request_id)
        text = completion.text.removesuffix(END_OF_TURN)
        tokens = len(completion.token_ids) or len(self.tokenizer.encode(text, add_special_tokens=False))
        return text, tokens, completion.prompt_tokens, completion.finish_reason, time.perf_counter() - started

    async def _call(self, call: ToolCall) -> str:
        tool = self.tools.get(call.name)
        if tool is None:
            return f"Error: unknown tool {call.name!r}; available: {', '.join(self.tools)}"
        try:
            return await tool(call.arguments)
        except Exception as error:  # noqa: BLE001 - a tool failure is an observation, never a crash
            return f"Error: {type(error).__name__}: {error}"

    def _compact(self, messages: list[dict[str, Any]]) -> None:
        cfg = self.config
        results = [m for m in messages if m["role"] == "tool"]
        if cfg.compact_after_chars is None or sum(len(m["content"]) for m in results) <= cfg.compact_after_chars:
            return
        placeholder = templates.render("compacted", cfg.prompt_version)
        for message in results[: max(len(results) - cfg.keep_recent_results, 0)]:
            message["content"] = placeholder

    async def run(self, system: str, user: str, request_id: str | None = None) -> ToolRun:
        cfg = self.config
        started = time.perf_counter()
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        turns: list[dict[str, Any]] = []
        output_tokens = prompt_tokens = 0
        answer, stop_reason = None, "max_turns"
        for index in range(cfg.max_turns):
            text, tokens, prompt_n, finish, latency = await self._generate(messages, request_id)
            output_tokens, prompt_tokens = output_tokens + tokens, prompt_tokens + prompt_n
            messages.append({"role": "assistant", "content": text})
            parsed = parse_turn(text)
            turn = {"index": index, "text": text, "tokens": tokens, "finish_reason": finish, "latency_s": latency,
                    "calls": [], "error": parsed.error}
            turns.append(turn)
            if parsed.answer is not None:
                answer, stop_reason = parsed.answer, "answer"
                break
            if parsed.calls:
                results = await asyncio.gather(*(self._call(c) for c in parsed.calls))
                for call, result in zip(parsed.calls, results):
                    turn["calls"].append({"name": call.name, "arguments": call.arguments, "result_chars": len(result)})
                    messages.append({"role": "tool", "name": call.name, "content": result})
                self._compact(messages)
            elif finish == "length":
                messages.append({"role": "user", "content": templates.render("continue", cfg.prompt_version)})
            elif cfg.plain_reply_is_answer and parsed.content.strip() and "<tool_call>" not in parsed.content:
                answer, stop_reason = parsed.content.strip(), "plain_reply"
                break
            else:
                error = parsed.error or "no tool call and no <answer> block"
                messages.append({"role": "user", "content": templates.render("invalid_action", cfg.prompt_version, error=error)})
        if answer is None and cfg.finalize:
            messages.append({"role": "user", "content": templates.render("finalize", cfg.prompt_version)})
            text, tokens, prompt_n, finish, latency = await self._generate(messages, request_id, with_tools=False)
            output_tokens, prompt_tokens = output_tokens + tokens, prompt_tokens + prompt_n
            messages.append({"role": "assistant", "content": text})
            turns.append({"index": len(turns), "text": text, "tokens": tokens, "finish_reason": finish, "latency_s": latency, "calls": [], "finalize": True})
            parsed = parse_turn(text)
            final = parsed.answer if parsed.answer is not None else parsed.content.strip()
            if final:
                answer, stop_reason = final, "finalize"
        return ToolRun(answer, stop_reason, len(turns), output_tokens, prompt_tokens, time.perf_counter() - started, turns, messages)
