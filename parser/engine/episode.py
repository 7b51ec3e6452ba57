"""The episode engine: paper Algorithm 1, the one agent loop of the project.

Training (the verl agent loop), eval, the tool-using baselines (agentic RAG, the DCI agent), the
DCI subagent and the demo all run `EpisodeEngine`; behaviour differences are `EpisodeConfig`
values, the protocol object (`parser.engine.protocol`) or a `parser.engine.tools.Toolset`, never a second loop.

    await engine.run(question, chunks, doc_id=...)        # ParSer: query_agents over the chunks
    await engine.run_tools(question, toolset, doc_id=...)  # any tool set (RAG, DCI, ...)

One turn (Algorithm 1, ll. 5-20): the lead generates from the exact token stream it has seen so
far -> its output is parsed -> an answer ends the episode; the turn's tool calls run
concurrently (`Toolset.execute`; for ParSer each query is scattered to every chunk's reader and
gathered into one observation) -> the observation is appended -> repeat until an answer or
`max_turns`. Unusable output gets the tool set's invalid-action hint and the loop continues.
A turn's fan-out is bounded: at most `max_tool_calls_per_turn` calls run (ParSer's scatter also
keeps queries x chunks within `max_subagent_requests_per_turn`); a call past the bound is
answered "not run" and counted in `Turn.calls_not_run`.

The token view for training is built by *appending* what the model actually saw — never by
re-rendering history (Qwen3.5's template drops earlier `<think>` blocks, which would break the
prefix property). Generated tokens get mask 1; observation and template tokens mask 0. A turn
cut at its token limit is closed with the end-of-turn token (mask 0) before the observation.

Where a baseline's reference protocol departs from Algorithm 1 (a plain reply as the answer, a
continuation prompt after a cut turn, compaction, a tool-free finalize turn), its tool set's
`rules` (`parser.engine.tools.TurnRules`) say so, through hooks the loop calls at fixed points;
ParSer's `QueryAgents` has none. Compaction and finalize are eval-only: the prompts after them
are re-rendered from the messages, so `Trajectory.token_view_valid` is set False (and the verl
agent loop, which runs only `QueryAgents`, never meets them). So is a prompt from state
(`TurnRules.state`, a `parser.engine.tools.StatePrompt`: LongHarness): before each turn the rule gives
the whole prompt, rendered from its state (the lead's messages are replaced, nothing is
appended), the turn's decoding constraint, the reading of the reply into an action, and after the
turn whether the episode ends; the turns, budgets, retries, fan-out bounds, progress events and
the trajectory stay this loop's.

Honest token view: the lead's generated ids are the ids the backend reports. A backend that
returns only text (an OpenAI server without `return_token_ids`) has its text re-tokenised, which
need not give the ids the model sampled; the trajectory then says so (`token_view_valid=False`,
`token_view_note`) and training refuses it. Lead generations are retried like subagent reads
(`parser.serving.retry`), under their backend's own deadline (`request_timeout_s` is the subagent
read's); one that fails for good raises `CallFailed` out of the episode.

Constrained decoding (off in every paper config; both recorded in `Trajectory.constraints`):
`constrain_subagents` decodes subagent replies under the finding's JSON schema (answer before
evidence, so a reply cut at its budget still carries the answer); `constrain_lead` allows one
tool call or one `<answer>` per lead turn (`parser.text.actions.action_regex`), which is how an
untrained small lead (the CPU demo's SmolLM2-135M) reaches the tool at all; `distinct_queries`
adds to it that a query asked before may not be asked again verbatim (a greedy 135M lead
otherwise sends its first query every turn, and each repeat costs a whole scatter round; the
regex carries its exclusion apart, `SamplingParams.exclusion`, so an in-process backend compiles
the constraint once per episode instead of every turn);
`query_first`, that no `<answer>` comes before the first query (Qwen2.5-Coder-0.5B otherwise
answers every question in its first turn, a guess that never reads the document);
`answer_last_turn`, that the last of `max_turns` turns is an `<answer>` (a small lead otherwise
ends every CPU episode unanswered, its budget spent on queries). It changes the lead's sampling
distribution, so training refuses it.

The protocol object (`parser.engine.protocol`, from `EpisodeConfig.protocol`: this project's or the
authors' release's) decides each turn's budget and parse, whether a generation of no tokens
ends the episode, whether the answer turn is closed, the final answer, and the chat format's
end-of-turn token. Invalid turns are recorded in `Trajectory.invalid_turn_spans` for the
protocol's mask rule, applied once the reward is known (`Protocol.mask_invalid_turns`).
"""
from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import math
import time
from typing import Any, Callable

from parser.engine import progress, prompts
from parser.text.actions import LeadAction, QueryExclusion, ToolCall, action_constraint, split_thinking
from parser.serving.types import Backend, BackendError, Completion, SamplingParams
from parser.text.chat_format import ChatFormat
from parser.text.chunking import Chunk
from parser.base.config import EpisodeConfig, with_turn_rules
from parser.engine.protocol import Protocol, protocol_for
from parser.serving.retry import RetryPolicy
from parser.engine.tools import ChunkReader, QueryAgents, StatePrompt, Toolset, TurnRules, not_run
from parser.records.trajectory import Trajectory, Turn


class LeadContext:
    """The agent's token stream and chat messages, grown by appending only.

    What comes from outside — the question and every tool's output (findings, search results,
    file text) — passes `untrusted` before it is rendered (`Protocol.untrusted`: under `parser`
    it can never become a control token of the chat template)."""

    def __init__(self, tokenizer: Any, toolset: Toolset, question: str, config: EpisodeConfig, chat: ChatFormat,
                 untrusted: Callable[[str], str] = lambda text: text):
        self.tokenizer = tokenizer
        self.config = config
        self.chat = chat
        self.untrusted = untrusted
        self.template_kwargs = {"enable_thinking": config.lead_thinking}
        self.tools = toolset.schemas()
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": toolset.system_prompt()},
            {"role": "user", "content": toolset.user_prompt(untrusted(question))},
        ]
        if self.tools and self._template_ignores_tools():
            fallback = prompts.render("tool_format_fallback", config.prompt_version,
                                      tools="\n".join(json.dumps(t, ensure_ascii=False) for t in self.tools))
            self.messages[0]["content"] += "\n\n" + fallback
        opening = self._render(self.messages, add_generation_prompt=True)
        self.prompt_ids: list[int] = self._encode(opening)
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.end_of_turn_id = chat.end_of_turn_id(tokenizer)
        self.rerendered = False  # an eval-only option rewrote history: prompts come from `messages`
        self.token_view_note: str | None = None  # why the token view is approximate, if it is
        self._measured: tuple[list[dict[str, Any]], list[int]] | None = None  # the last `measure`'s messages and ids
        # the generation prompt opens <think>: a turn without </think> is all thinking (no action)
        self.thinking_open = opening.rstrip().endswith("<think>")
        self.asked: list[str] = []  # the queries sent so far (the lead constraint's exclusions)
        self.last_turn = False  # under `answer_last_turn`, set before the episode's last turn
        self._dialect = "xml" if "<function=" in opening else "json"  # the template's tool-call format
        # the lead's action constraint; a prompt from state brings its own (`StatePrompt.sampling`)
        # (the regex, and the queries it excludes apart: `SamplingParams.exclusion`)
        self.action_regex: str | None = None
        self.exclusion: QueryExclusion | None = None
        if config.constrain_lead and toolset.rules.state is None:
            self.action_regex, self.exclusion = self._action_constraint()

    def _action_constraint(self) -> tuple[str, QueryExclusion | None]:
        """The lead constraint in this chat template's tool-call dialect, given the queries so far:
        under `distinct_queries` none of them again, under `query_first` no answer before one,
        under `answer_last_turn` only an answer on the last turn (it overrides `query_first`)."""
        return action_constraint(self.tools, self._dialect, thinking=self.thinking_open,
                                 exclude=self.asked if self.config.distinct_queries else (),
                                 answer=bool(self.asked) or not self.config.query_first or self.last_turn,
                                 call=not self.last_turn)

    def begin_last_turn(self) -> None:
        """The next turn is the episode's last: under `answer_last_turn` it may only answer."""
        if self.config.answer_last_turn and self.action_regex is not None:
            self.last_turn = True
            self.action_regex, self.exclusion = self._action_constraint()

    def note_queries(self, queries: list[str]) -> None:
        """Remember the turn's queries; the constraint follows them (`_action_constraint`)."""
        self.asked += queries
        if self.action_regex is not None:
            self.action_regex, self.exclusion = self._action_constraint()

    def _template_ignores_tools(self) -> bool:
        """True for chat templates without tool support: the tool schemas must go in as text."""
        return self._render(self.messages, add_generation_prompt=True) == self._render(
            self.messages, add_generation_prompt=True, with_tools=False)

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, with_tools: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=(self.tools or None) if with_tools else None, tokenize=False,
            add_generation_prompt=add_generation_prompt, **self.template_kwargs,
        )

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    @property
    def stream(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def prompt(self, with_tools: bool = True) -> list[int]:
        """What the next turn is generated from: the stream, unless history was rewritten. A prompt
        from state that `measure` just tokenised is sent as those ids, not tokenised again."""
        if self.rerendered or not with_tools:
            if with_tools and self._measured is not None and self._measured[0] == self.messages:
                return list(self._measured[1])
            return self._encode(self._render(self.messages, add_generation_prompt=True, with_tools=with_tools))
        return self.stream

    def append_generation(self, completion: Completion) -> list[int]:
        """Append one generation; returns its token ids. Re-tokenising text (a backend without
        ids) or logprobs that do not align with the ids make the view approximate, said once.
        `close_turn` follows, unless the protocol leaves the answer turn open."""
        token_ids, logprobs = list(completion.token_ids), completion.logprobs
        if not token_ids:
            token_ids = self._encode(completion.text)
            self.token_view_note = self.token_view_note or (
                "the lead backend returned text without token ids; response_ids are a re-tokenisation")
        if logprobs is not None and len(logprobs) != len(token_ids):
            self.token_view_note = self.token_view_note or (
                f"the lead backend returned {len(logprobs)} logprobs for {len(token_ids)} token ids")
            logprobs = None
        if logprobs is not None and not all(isinstance(x, (int, float)) and math.isfinite(x) for x in logprobs):
            self.token_view_note = self.token_view_note or "the lead backend returned logprobs that are not finite numbers"
            logprobs = None
        self.response_ids += token_ids
        self.response_mask += [1] * len(token_ids)
        self.response_logprobs += list(logprobs) if logprobs else [0.0] * len(token_ids)
        return token_ids

    def close_turn(self, token_ids: list[int]) -> None:
        """End the generated turn `token_ids` with the end-of-turn token if it did not (cut at the limit)."""
        if not token_ids or token_ids[-1] != self.end_of_turn_id:
            self._append_context([self.end_of_turn_id])

    def _append_context(self, token_ids: list[int]) -> None:
        self.response_ids += token_ids
        self.response_mask += [0] * len(token_ids)
        self.response_logprobs += [0.0] * len(token_ids)

    def observation_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Tokens the template puts between the assistant's end-of-turn and the next generation.

        Rendered after a fixed stand-in history, so it depends only on `messages`: exactly the
        template's rendering of the tool (or hint) turn plus the generation prompt.
        """
        marker = "\u2063parser-stand-in\u2063"
        history = [self.messages[0], {"role": "user", "content": "?"}, {"role": "assistant", "content": marker}]
        rendered = self._render(history + messages, add_generation_prompt=True)
        end_of_turn = self.chat.end_of_turn
        end = rendered.find(end_of_turn, rendered.rindex(marker))
        if end < 0:
            raise RuntimeError(f"chat template does not close assistant turns with {end_of_turn}")
        return self._encode(rendered[end + len(end_of_turn):])

    def append_observation(self, messages: list[dict[str, Any]]) -> None:
        """Append a tool (or hint) turn; tool outputs pass `untrusted` first."""
        messages = [{**m, "content": self.untrusted(m["content"])} if m["role"] == "tool" else m for m in messages]
        self._append_context(self.observation_ids(messages))
        self.messages += messages

    def history_rewritten(self) -> None:
        """Earlier messages were changed (compaction): later prompts are rendered from `messages`."""
        self.rerendered = True

    def measure(self, messages: list[dict[str, Any]]) -> int:
        """The prompt length, in lead tokens, of a turn generated from `messages`. The ids are kept
        (with a copy of `messages`, which the caller may change) for `prompt`: a state rule measures
        the prompt it then chooses (`StatePrompt.messages`)."""
        ids = self._encode(self._render(messages, add_generation_prompt=True))
        self._measured = (copy.deepcopy(messages), ids)
        return len(ids)

    def replace_messages(self, messages: list[dict[str, Any]]) -> None:
        """The next prompt is `messages` (a prompt from state), not the history so far."""
        self.messages = list(messages)
        self.history_rewritten()


class EpisodeEngine:
    """Runs episodes for one lead backend (and, for ParSer, one chunk reader); safe to share across tasks.
    `protocol`: the one chosen for `config` by whoever built the engine (default `protocol_for(config)`)."""

    def __init__(self, lead: Backend, lead_tokenizer: Any, reader: ChunkReader | None = None,
                 config: EpisodeConfig | None = None, protocol: Protocol | None = None):
        self.lead = lead
        self.tokenizer = lead_tokenizer
        self.reader = reader
        self.config = config or EpisodeConfig()
        self.protocol = protocol or protocol_for(self.config)
        self._slots = asyncio.Semaphore(self.config.max_concurrency)
        self._lead_retry = dataclasses.replace(RetryPolicy.of(self.config), timeout_s=None)
        self._vocab_size = len(lead_tokenizer) if hasattr(lead_tokenizer, "__len__") else float("inf")

    def _count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def query_agents(self, chunks: list[Chunk], doc_id: str) -> QueryAgents:
        """ParSer's tool set over one document's chunks, sharing this engine's concurrency bound."""
        if self.reader is None:
            raise ValueError("EpisodeEngine.run needs a chunk reader (EpisodeEngine(lead, tokenizer, reader, config))")
        return QueryAgents(self.reader, chunks, doc_id, self.config, self.protocol, self._slots, self._count_tokens)

    async def run(self, question: str, chunks: list[Chunk], doc_id: str = "doc", request_id: str | None = None) -> Trajectory:
        """One ParSer episode (paper Algorithm 1) over `chunks`; the lead never sees them."""
        trajectory = await self.run_tools(question, self.query_agents(chunks, doc_id), doc_id=doc_id, request_id=request_id)
        trajectory.num_chunks = len(chunks)
        return trajectory

    async def run_tools(self, question: str, toolset: Toolset, *, doc_id: str = "doc", request_id: str | None = None,
                        routing_key: str | None = None) -> Trajectory:
        """One episode with any tool set: paper Algorithm 1, its line numbers on the right.
        `request_id` keeps the episode on one server (default `doc_id`); `routing_key`, if given,
        is sent with every generation (gateway pinning)."""
        cfg, protocol = self.config, self.protocol
        protocol.check_toolset(toolset.names)
        state = toolset.rules.state  # a prompt from state (LongHarness), else None
        started = time.perf_counter()
        context = LeadContext(self.tokenizer, toolset, question, cfg, protocol.chat,  # l. 3: H <- [system, user(q)]
                              untrusted=lambda text: protocol.untrusted(text, self.tokenizer))
        trajectory = Trajectory(question=question, doc_id=doc_id, num_chunks=0, prompt_ids=context.prompt_ids,
                                constraints=cfg.constraints())
        if state is not None:  # re-rendered from state every turn: no token view, the rule's own constraint
            trajectory.token_view_valid, trajectory.token_view_note = False, state.token_view_note
            trajectory.constraints = [c for c in trajectory.constraints if not c.startswith("lead:")] + state.constraints
        ids = {"request_id": request_id or doc_id, **({"routing_key": routing_key} if routing_key is not None else {})}
        for turn_index in range(cfg.max_turns):  # l. 4: for t = 1 to K
            budget = protocol.turn_budget(len(context.response_ids))
            if budget <= 0:
                trajectory.stop_reason = "response_length"
                break
            if turn_index == cfg.max_turns - 1:
                context.begin_last_turn()
            if state is not None:  # the prompt is the rule's state, not the history
                context.replace_messages(state.messages(turn_index, cfg.max_turns - turn_index, context.measure))
            step = await self._turn(context, context.prompt(), turn_index, budget, toolset.names, ids, state)  # l. 5
            if step is None:
                trajectory.stop_reason = "empty_generation"
                break
            turn, action, content = step
            trajectory.turns.append(turn)
            if action.answer is not None:  # ll. 6-8: an answer ends the episode
                trajectory.answer, trajectory.stop_reason = action.answer, "answer"
                if state is not None:
                    trajectory.stop_reason = state.end_turn(answered=True) or "answer"
                progress.turn_finished(doc_id, turn)
                break
            if action.calls:  # ll. 9-16: scatter every query to every chunk, gather, append
                observation = await self._execute(toolset, action.calls, turn)
                context.note_queries(action.queries)
            elif state is None:  # ll. 17-18: the invalid-action hint (unless the tool set's rules say otherwise)
                observation = self._without_call(toolset, context, trajectory, turn, action, content)
            if state is not None:  # what the calls brought is in the state the next prompt renders: nothing is appended
                stop = state.end_turn(answered=False)
                progress.turn_finished(doc_id, turn)
                if stop is not None:
                    trajectory.stop_reason = stop
                    break
                continue
            progress.turn_finished(doc_id, turn)
            if observation is None:
                break
            context.append_observation(observation)
            if action.calls and toolset.rules.compact(context.messages, cfg.prompt_version):
                context.history_rewritten()
                trajectory.token_view_valid = False
        final = toolset.rules.finalize_prompt(cfg.prompt_version)
        if trajectory.stop_reason == "max_turns" and final is not None and protocol.turn_budget(len(context.response_ids)) > 0:
            await self._finalize(context, trajectory, final, ids)
        if context.token_view_note:
            trajectory.token_view_valid, trajectory.token_view_note = False, context.token_view_note
        trajectory.answer = protocol.final_answer(trajectory)  # l. 21
        trajectory.messages = context.messages
        trajectory.response_ids = context.response_ids
        trajectory.response_mask = context.response_mask
        trajectory.response_logprobs = context.response_logprobs
        trajectory.wall_s = time.perf_counter() - started
        return trajectory

    async def _execute(self, toolset: Toolset, calls: list[ToolCall], turn: Turn) -> list[dict[str, Any]]:
        """The turn's tool calls, concurrently, at most `max_tool_calls_per_turn` of them (each
        later one is answered "not run"); their records go on the turn."""
        bound = self.config.max_tool_calls_per_turn
        run, refused = calls[:bound], calls[bound:]
        started = time.perf_counter()
        result = await toolset.execute(run)
        turn.queries, turn.tool_calls, turn.calls_not_run = result.queries, result.calls, len(refused) + result.not_run
        turn.scatter_latency_s = time.perf_counter() - started
        refusal = not_run(len(calls), bound, self.config.prompt_version)
        return result.messages + [{"role": "tool", "name": c.name, "content": refusal} for c in refused]

    def _without_call(self, toolset: Toolset, context: LeadContext, trajectory: Trajectory, turn: Turn,
                      action: LeadAction, content: str) -> list[dict[str, Any]] | None:
        """The observation after a turn with neither a usable call nor an answer: the tool set's
        continuation prompt after a cut turn, else the invalid-action hint (the turn is recorded
        for the protocol's mask rule); None when the tool set's rules take the reply as the answer."""
        rules, cut = toolset.rules, turn.finish_reason == "length"
        if (answer := rules.reply_answer(content, cut)) is not None:
            turn.action_error = None
            trajectory.answer, trajectory.stop_reason = answer, "plain_reply"
            return None
        if (message := rules.continuation(cut, self.config.prompt_version)) is not None:
            return [{"role": "user", "content": message}]
        closed_here = context.response_mask[-1] == 0  # the engine closed a cut turn
        start = len(context.response_ids) - turn.lead_tokens - closed_here
        trajectory.invalid_turn_spans.append((start, start + turn.lead_tokens))
        return [{"role": "user", "content": toolset.invalid_action(action.error or "no tool call and no <answer> block")}]

    async def _turn(self, context: LeadContext, prompt: list[int], index: int, budget: int, tool_names: tuple[str, ...],
                    ids: dict[str, str], state: StatePrompt | None = None) -> tuple[Turn, LeadAction, str] | None:
        """Generate, append to the stream, parse (or let the `state` rule read the reply). Returns
        the turn, its action and its reply text; None for a generation of no tokens when the
        protocol ends the episode on one."""
        cfg = self.config
        sampling = SamplingParams(
            max_new_tokens=budget, temperature=cfg.lead_temperature, top_p=cfg.lead_top_p, top_k=cfg.lead_top_k,
            return_logprobs=True, regex=context.action_regex if tool_names else None,  # None under a state rule
            exclusion=context.exclusion if tool_names else None,
            **(state.sampling() if state is not None else {}),
        )
        lead_started = time.perf_counter()
        completion, attempts = await self._lead_retry.call(lambda: self._generate(prompt, sampling, ids))
        lead_latency = time.perf_counter() - lead_started
        if self.protocol.ends_on_empty_generation and not completion.token_ids and not completion.text:
            return None
        token_ids = context.append_generation(completion)
        text = completion.text if completion.text else self.tokenizer.decode(token_ids, skip_special_tokens=False)
        text = context.chat.strip_end(text)
        action = (state.read(text, context.thinking_open) if state is not None
                  else self.protocol.parse_turn(text, tool_names, thinking_open=context.thinking_open))
        if action.answer is None or self.protocol.closes_answer_turn:
            context.close_turn(token_ids)
        content = split_thinking(text, opened=context.thinking_open)[1].strip()
        context.messages.append({"role": "assistant", "content": content, "reasoning_content": action.thinking})
        turn = Turn(
            index=index, text=text, thinking=action.thinking, queries=[], answer=action.answer,
            action_error=action.error, lead_tokens=len(token_ids), finish_reason=completion.finish_reason,
            lead_latency_s=lead_latency, prompt_tokens=completion.prompt_tokens or len(prompt), lead_attempts=attempts,
        )
        return turn, action, content

    async def _generate(self, prompt: list[int], sampling: SamplingParams, ids: dict[str, str]) -> Completion:
        """One lead generation whose token ids the stream can take: ints inside the tokenizer's
        vocabulary (a garbled reply is a retryable `BackendError`; it once went straight into the
        training stream). Logprobs that are not finite numbers are dropped (the view says so)."""
        completion = await self.lead.generate(prompt, sampling, **ids)
        for position, token in enumerate(completion.token_ids):
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < self._vocab_size:
                raise BackendError(f"lead backend returned token id {token!r} at position {position}, outside the lead "
                                   f"tokenizer's vocabulary [0, {self._vocab_size})", retryable=True)
        return completion

    async def _finalize(self, context: LeadContext, trajectory: Trajectory, message: str, ids: dict[str, str]) -> None:
        """One tool-free turn for the answer (eval-only: its prompt has no tool schemas)."""
        context.append_observation([{"role": "user", "content": message}])
        trajectory.token_view_valid = False
        budget = self.protocol.turn_budget(len(context.response_ids))
        step = await self._turn(context, context.prompt(with_tools=False), len(trajectory.turns), budget, (), ids)
        if step is None:
            return
        turn, action, content = step
        trajectory.turns.append(turn)
        final = action.answer if action.answer is not None else (content if "<tool_call>" not in content else "")
        if final:
            turn.action_error = None
            trajectory.answer, trajectory.stop_reason = final, "finalize"
        progress.turn_finished(trajectory.doc_id, turn)


def baseline_engine(lead: Backend, tokenizer: Any, episode: Any, where: str, compose: str) -> tuple[EpisodeEngine, TurnRules]:
    """The engine and turn rules of a tool-using baseline (RAG, the DCI agent, the DCI reader) from
    its Hydra-composed `episode` section; `compose` says how to get one when it is missing."""
    if episode is None:
        raise ValueError(f"{where}: no episode section: compose it ({compose})")
    config, rules = with_turn_rules(episode, where)
    return EpisodeEngine(lead, tokenizer, config=config), TurnRules.from_section(rules, f"{where}: episode.turn_rules")
