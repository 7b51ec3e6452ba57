"""The model edge, scripted: the one test double for a lead or subagent model (helpers, not tests).

Each stands in for a real model server behind `parser.serving.backends` (SGLang, vLLM, the in-process
transformers backend); everything between (prompts, parsing, tools, gather, the token view) is
the real engine.

`ScriptedLead` replays turns as the tokenizer's ids (a finished turn ends with <|im_end|>), or raw
id lists a garbled backend would send. `ScriptedModel` answers `reply(prompt_text, call_index)`,
for tests that script by what the prompt says (the baselines, DCI, the data filters). Both record
every prompt and count their calls.

    lead = ScriptedLead(tokenizer, ["Ask.\\n</think>\\n\\n" + CALL.format("query_agents", "query", "Who?"),
                                    ("cut mid-thought", "length")])
    model = ScriptedModel(lambda text, i: "\\\\boxed{Lisbon}" if "treaty" in text else "unknown")
"""
from __future__ import annotations

from typing import Callable

from parser.serving.types import Completion

CALL = "<tool_call>\n<function={}>\n<parameter={}>\n{}\n</parameter>\n</function>\n</tool_call>"
ANSWER = "Done.\n</think>\n\n<answer>x</answer>"


class ScriptedLead:
    """`turns`: text (a finished turn) or (text, finish_reason); then `ANSWER` for ever. `ids`:
    raw id lists (or (ids, finish_reason)) returned first, as they are. `logprobs`: the first logprobs of every turn, the
    rest `logprob`. Records each prompt's ids (`prompts`), the ids it returned (`generated`) and
    each call's keyword arguments (`kwargs`); `on_call(n)`, if given, runs as the n-th call starts
    (e.g. to stop a server between two turns)."""

    def __init__(self, tokenizer, turns, *, ids=None, logprobs=None, logprob: float = -0.1,
                 on_call: Callable[[int], None] | None = None):
        self.tokenizer = tokenizer
        self.turns = [t if isinstance(t, tuple) else (t, "stop") for t in turns]
        self.ids, self.logprobs, self.logprob = list(ids or []), list(logprobs or []), logprob
        self.on_call = on_call
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.prompts: list[list[int]] = []
        self.generated: list[list[int]] = []
        self.kwargs: list[dict] = []

    @property
    def calls(self) -> int:
        return len(self.prompts)

    async def generate(self, prompt, sampling, **kwargs):
        self.prompts.append(list(prompt))
        self.kwargs.append(kwargs)
        if self.on_call is not None:
            self.on_call(self.calls)
        if self.ids:
            ids, finish = self.ids.pop(0) if isinstance(self.ids[0], tuple) else (self.ids.pop(0), "stop")
            ids = list(ids)
            self.generated.append(ids)
            return Completion(text="", token_ids=ids, logprobs=[self.logprob] * len(ids), finish_reason=finish)
        text, finish = self.turns.pop(0) if self.turns else (ANSWER, "stop")
        ids = self.tokenizer.encode(text, add_special_tokens=False) + ([self.end] if finish == "stop" else [])
        self.generated.append(ids)
        logprobs = (self.logprobs + [self.logprob] * len(ids))[: len(ids)]
        return Completion(text="", token_ids=ids, logprobs=logprobs, finish_reason=finish)

    async def aclose(self):
        pass


class ScriptedModel:
    """Replies `reply(prompt_text, call_index)`; records every prompt as text (`prompts`) and its
    routing key (`routing_keys`).

    A chat-template text prompt (the single-call baselines, a reader's prompt) gets text back; a
    token-id prompt — the episode engine's stream — is decoded with `tokenizer` and gets the
    reply's token ids closed by <|im_end|>, as a backend that sees tokens answers. `sent="ids"`
    (or "text") makes a prompt of the other kind a test failure: what the caller must send."""

    def __init__(self, reply: Callable[[str, int], str], tokenizer=None, *, sent: str | None = None):
        assert sent in (None, "text", "ids"), sent
        self.reply, self.tokenizer, self.sent = reply, tokenizer, sent
        self.prompts: list[str] = []
        self.routing_keys: list[str | None] = []

    @property
    def calls(self) -> int:
        return len(self.prompts)

    async def generate(self, prompt, sampling, *, routing_key=None, request_id=None):
        ids = not isinstance(prompt, str)
        assert self.sent in (None, "ids" if ids else "text"), f"expected a {self.sent} prompt, got {type(prompt).__name__}"
        if ids:
            assert self.tokenizer is not None and all(isinstance(t, int) for t in prompt), "token ids need the tokenizer"
            prompt = self.tokenizer.decode(list(prompt), skip_special_tokens=False)
        self.prompts.append(prompt)
        self.routing_keys.append(routing_key)
        text = self.reply(prompt, len(self.prompts) - 1)
        if not ids:
            return Completion(text=text, finish_reason="stop")
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        return Completion(text=text, token_ids=ids, finish_reason="stop")

    async def aclose(self):
        pass
