"""Full-context answering (paper Appendix D.1): the question and the whole document in one call.

Two turns, as in the paper: turn 1 shows the document and the question and lets the model
reason (thinking or not) and answer; turn 2 is a short follow-up asking only for the concise
final answer, whose text is the prediction. The follow-up exists because thinking models often
ignore answer-format instructions after long deliberation. Temperature 0.

Documents beyond the model's native window need YaRN RoPE scaling on the *server* (the paper
uses factor 4.0 on Qwen3.5's 262,144-token window, about 1M tokens):

    python -m sglang.launch_server --model-path Qwen/Qwen3.5-4B --context-length 1048576 \
        --json-model-override-args '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144}}'

then raise `max_context_tokens` (configs/method/full_context_yarn.yaml). A prompt that does not
fit is never sent silently cut: `on_overflow` says whether the sample is recorded as unanswered
with the reason (`skip`), raises (`error`), or keeps the head and tail of the document
(`truncate_middle`, MemAgent's reference behaviour).

Both calls go through `parser.serving.retry` (the `retry:` section: timeouts and retryable backend
errors are retried; a call that still fails fails the sample, which eval records and retries).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Mapping

from parser.text.actions import split_thinking
from parser.serving.types import SamplingParams
from parser.text.chat_format import CHATML
from parser.serving.backends.models import Models
from parser.methods.base import MethodResult, Sample
from parser.records.trace import CallTrace
from parser.engine.prompts import DEFAULT_VERSION, PromptSet
from parser.serving.retry import RetryingBackend, RetryPolicy

log = logging.getLogger(__name__)

# this method's prompts: prompts/<version>/ beside this file (configs/method/full_context.yaml `prompt_version`)
PROMPTS = PromptSet(__package__, {"full_context_user": {"context", "question"}, "full_context_followup": set()}, "prompts")


class ContextOverflow(ValueError):
    pass


def shown_reply(text: str, tokenizer: Any) -> dict[str, str]:
    """The first turn's reply as the assistant message of the follow-up prompt, rendered as text:
    a reply that spells out `<|im_end|>` (or quotes the document's) must not become turn
    boundaries there. Its thinking goes in `reasoning_content`, as the chat template would split
    it off itself (Qwen3 / Qwen3.5 drop it from a turn before the last user message), so the
    rendered prompt is the template's for any reply without control strings."""
    if "</think>" not in text:
        return {"role": "assistant", "content": CHATML.neutralize(text, tokenizer)}
    thinking, reply = split_thinking(text)
    return {"role": "assistant", "content": CHATML.neutralize(reply.lstrip("\n"), tokenizer),
            "reasoning_content": CHATML.neutralize(thinking, tokenizer)}


class FullContextMethod:
    name = "full_context"
    reading = "given whole to the model in one call"

    def __init__(
        self,
        models: Models,
        *,
        thinking: bool = False,
        max_new_tokens: int = 8192,
        followup_max_new_tokens: int = 256,
        temperature: float = 0.0,
        max_context_tokens: int = 262_144,
        on_overflow: str = "skip",
        prompt_version: str = DEFAULT_VERSION,
        retry: Mapping[str, Any] | None = None,
    ):
        """`retry`: `parser.serving.retry.RETRY_KEYS` (max_attempts, retry_backoff_s, request_timeout_s)."""
        if on_overflow not in ("skip", "error", "truncate_middle"):
            raise ValueError(f"full_context: on_overflow must be skip, error or truncate_middle, got {on_overflow!r}")
        self.models = models
        self.lead = RetryingBackend(models.lead, RetryPolicy.from_section(retry))
        self.thinking = thinking
        self.turn1 = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
        self.turn2 = SamplingParams(max_new_tokens=followup_max_new_tokens, temperature=temperature)
        self.max_context_tokens = max_context_tokens
        self.on_overflow = on_overflow
        self.prompt_version = prompt_version

    def _render(self, messages: list[dict[str, Any]]) -> str:
        return self.models.lead_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=self.thinking)

    def _count(self, text: str) -> int:
        return len(self.models.lead_tokenizer.encode(text, add_special_tokens=False))

    def _fit(self, sample: Sample) -> tuple[str, int, str | None]:
        """(context to show, prompt tokens, overflow note or None)."""
        overhead = self._count(self._render([{"role": "user", "content": PROMPTS.render(
            "full_context_user", self.prompt_version, context="", question=sample.question)}]))
        room = self.max_context_tokens - self.turn1.max_new_tokens - self.turn2.max_new_tokens - overhead - 64
        ids = self.models.lead_tokenizer.encode(sample.context, add_special_tokens=False)
        if len(ids) <= room:
            return sample.context, overhead + len(ids), None
        note = (f"sample {sample.id}: document is {len(ids)} tokens but only {max(room, 0)} fit in max_context_tokens="
                f"{self.max_context_tokens} (after the prompt and {self.turn1.max_new_tokens}+{self.turn2.max_new_tokens} "
                "new tokens); serve the model with YaRN rope scaling and raise max_context_tokens "
                "(configs/method/full_context_yarn.yaml), or set on_overflow: truncate_middle")
        if self.on_overflow != "truncate_middle" or room <= 0:
            raise ContextOverflow(note)
        half = room // 2
        decode = self.models.lead_tokenizer.decode
        return decode(ids[:half]) + "\n...\n" + decode(ids[len(ids) - half:]), overhead + 2 * half, note

    async def run(self, sample: Sample) -> MethodResult:
        started = time.perf_counter()
        tokenizer = self.models.lead_tokenizer  # the document and question never become control tokens
        sample = dataclasses.replace(sample, context=CHATML.neutralize(sample.context, tokenizer),
                                     question=CHATML.neutralize(sample.question, tokenizer))
        try:
            context, prompt_tokens, overflow = self._fit(sample)
        except ContextOverflow as error:
            if self.on_overflow == "error":
                raise
            log.warning("%s", error)
            return MethodResult(None, 0, time.perf_counter() - started, trace=CallTrace({"error": str(error), "stop_reason": "context_overflow"}))
        messages = [{"role": "user", "content": PROMPTS.render("full_context_user", self.prompt_version, context=context, question=sample.question)}]
        first = await self.lead.generate(self._render(messages), self.turn1, request_id=sample.id)
        text = CHATML.strip_end(first.text)
        thinking, reply = split_thinking(text)
        messages += [
            shown_reply(text, tokenizer),
            {"role": "user", "content": PROMPTS.render("full_context_followup", self.prompt_version)},
        ]
        second = await self.lead.generate(self._render(messages), self.turn2, request_id=sample.id)
        _, answer = split_thinking(CHATML.strip_end(second.text))
        tokens = sum(len(c.token_ids) or self._count(c.text) for c in (first, second))
        return MethodResult(
            answer=answer.strip() or None,
            steps=2,
            wall_s=time.perf_counter() - started,
            lead_output_tokens=tokens,
            trace=CallTrace({
                "prompt_tokens": prompt_tokens, "overflow": overflow, "turn1": reply.strip(), "turn1_thinking_chars": len(thinking),
                "turn2": second.text, "finish_reasons": [first.finish_reason, second.finish_reason],
            }),
        )

    async def aclose(self) -> None:
        await self.models.aclose()
