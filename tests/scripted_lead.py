"""The lead backend, scripted: the outer edge of the engine tests (helpers, not tests).

Replays turns as the tokenizer's ids (a finished turn ends with <|im_end|>), or raw id lists a
garbled backend would send; counts its calls. Everything between (prompts, parsing, tools,
gather, the token view) is the real engine.

    lead = ScriptedLead(tokenizer, ["Ask.\\n</think>\\n\\n" + CALL.format("query_agents", "query", "Who?"),
                                    ("cut mid-thought", "length")])
"""
from __future__ import annotations

from parser.backends.base import Completion

CALL = "<tool_call>\n<function={}>\n<parameter={}>\n{}\n</parameter>\n</function>\n</tool_call>"
ANSWER = "Done.\n</think>\n\n<answer>x</answer>"


class ScriptedLead:
    """`turns`: text (a finished turn) or (text, finish_reason); then `ANSWER` for ever. `ids`:
    raw id lists returned first, as they are. `logprobs`: the first logprobs of every turn."""

    def __init__(self, tokenizer, turns, *, ids=None, logprobs=None):
        self.tokenizer = tokenizer
        self.turns = [t if isinstance(t, tuple) else (t, "stop") for t in turns]
        self.ids, self.logprobs = list(ids or []), list(logprobs or [])
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.calls = 0

    async def generate(self, prompt, sampling, **_):
        self.calls += 1
        if self.ids:
            ids = self.ids.pop(0)
            return Completion(text="", token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="stop")
        text, finish = self.turns.pop(0) if self.turns else (ANSWER, "stop")
        ids = self.tokenizer.encode(text, add_special_tokens=False) + ([self.end] if finish == "stop" else [])
        logprobs = (self.logprobs + [-0.1] * len(ids))[: len(ids)]
        return Completion(text="", token_ids=ids, logprobs=logprobs, finish_reason=finish)

    async def aclose(self):
        pass
