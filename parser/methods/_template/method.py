"""Closed-book answering: the question alone, one call to the lead, no document.

Everything a method needs is here: its prompts (`PROMPTS`, the folder's `prompts/<version>/`), its
knobs as keyword arguments (the method config's keys), the lead behind `parser.serving.retry`, untrusted
text neutralised before it reaches a chat template, and a `MethodResult` per sample. Replace
`run` with your method; keep the constructor's shape (`models` first, settings by keyword).

    parser eval --config-name tiny_cpu method=<name>   # configs/method/<name>.yaml
"""
from __future__ import annotations

import time
from typing import Any, Mapping

from parser.text.actions import split_thinking
from parser.serving.types import SamplingParams
from parser.serving.backends.models import Models
from parser.text.chat_format import CHATML
from parser.methods.base import MethodResult, Sample
from parser.records.trace import CallTrace
from parser.engine.prompts import DEFAULT_VERSION, PromptSet
from parser.serving.retry import RetryingBackend, RetryPolicy

# this folder's prompts: prompts/<version>/<name>.txt, each with the fields it takes
PROMPTS = PromptSet(__package__, {"closed_book": {"question"}}, "prompts")


class ClosedBookMethod:
    name = "closed_book"
    reading = "not read: the model answers from what it knows"

    def __init__(self, models: Models, *, max_new_tokens: int = 256, temperature: float = 0.0, thinking: bool = False,
                 prompt_version: str = DEFAULT_VERSION, retry: Mapping[str, Any] | None = None):
        """`retry`: `parser.serving.retry.RETRY_KEYS` (max_attempts, retry_backoff_s, request_timeout_s)."""
        self.models, self.thinking, self.prompt_version = models, thinking, prompt_version
        self.lead = RetryingBackend(models.lead, RetryPolicy.from_section(retry))
        self.sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)

    async def run(self, sample: Sample) -> MethodResult:
        started = time.perf_counter()
        tokenizer = self.models.lead_tokenizer
        question = CHATML.neutralize(sample.question, tokenizer)  # the question never becomes control tokens
        messages = [{"role": "user", "content": PROMPTS.render("closed_book", self.prompt_version, question=question)}]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=self.thinking)
        reply = await self.lead.generate(prompt, self.sampling, request_id=sample.id)
        _, answer = split_thinking(CHATML.strip_end(reply.text))
        return MethodResult(answer=answer.strip() or None, steps=1, wall_s=time.perf_counter() - started,
                            lead_output_tokens=len(reply.token_ids), trace=CallTrace({"reply": reply.text, "finish_reason": reply.finish_reason}))

    async def aclose(self) -> None:
        await self.models.aclose()
