"""The loop every sequential reader shares: chunks read one at a time, in a chosen order, through one
bounded state; then one call that answers from the state alone.

MemAgent and ReMemR1 (`methods/memagent/`, `methods/rememr1/`) and Chain-of-Agents (`methods/coa/`) are this loop with their own
prompts and state hooks (`new_state`, `update_prompt`, `absorb`, `final_prompt`); InfMem
(`methods/infmem/`) adds a planning call before each update (`plan`) and may stop reading early
(`stop_reading`). Each call depends on the previous one, so the critical path is `chunks + 1` model
calls (`steps`; every call counted, planners' too): the coupling ParSer removes, and what makes
these methods sensitive to where evidence sits.

The reading order is a config value, `order:` (`parser.engine.ordering`): `document` (every method's
published behaviour, the default), `dense`, `chow_liu` (the CL paper's CL-order) or `dfs`, from
the scores of `scorer:` (`parser.engine.scorers`: the embedder, or BM25), computed from the question and
the chunks before the first call. Chunks are fixed token windows (`chunking: tokens`) or
ParSer's paragraph packing (`chunking: paragraphs`); a document longer than
`max_context_tokens` L keeps its first L//2 tokens and its last L - L//2 (MemAgent's and ReMemR1's
`input_ids[:max_len//2] + input_ids[-max_len//2:]`: L tokens, the odd one in the tail).

    parser eval method=memagent method.order=chow_liu     # MemAgent (CL-order)
    parser eval method=coa_cl                             # CoA (CL-order)

Thinking (`thinking: true`, enable_thinking): each reply is split at its last `</think>` while it
is still raw text, and only what follows is handed to `absorb` or to answer extraction, so no
`<think>` block is ever passed on as a memory or summary (`drop_thinking: true` does the same for
a model that thinks with thinking off). What a method keeps goes through `untrusted` before it
reaches a prompt. The prediction is each method's `extract`; here (Chain-of-Agents, whose
authors released no code) the project's lenient rule: the last `\\boxed{...}`, else the text after
the last "the answer is", else the reply itself. MemAgent and ReMemR1 use their authors' rules
(`parser.methods.memagent.rules`). Every call goes through
`parser.serving.retry` (`retry:`): timeouts and retryable backend errors are retried, and a call that
still fails fails the sample, which eval records and retries on re-run.
"""
from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Mapping

from parser.engine import prompts
from parser.text.actions import split_thinking
from parser.serving.types import SamplingParams
from parser.serving.backends.models import Models
from parser.text.chat_format import CHATML
from parser.text.chunking import chunk_document, split_paragraphs
from parser.methods.base import MethodResult, Sample
from parser.records.trace import SequentialTrace
from parser.engine.ordering import check_strategy, order_by_scores
from parser.serving.retry import RetryingBackend, RetryPolicy
from parser.engine.scorers import build_scorer

_ANSWER_IS = re.compile(r"the answer is", re.IGNORECASE)


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}`, braces balanced; None if there is none."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth, j = 0, i
    while j < len(text):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j].strip()
        j += 1
    return None


def extract_answer(text: str) -> tuple[str | None, str]:
    """(prediction, how): the last `\\boxed{}`, else after the last "the answer is", else the reply
    (the project's lenient rule: Chain-of-Agents' default, MemAgent's `lenient_extraction`)."""
    _, reply = split_thinking(text)
    boxed = last_boxed(reply)
    if boxed is not None:
        return boxed, "boxed"
    matches = list(_ANSWER_IS.finditer(reply))
    if matches:
        tail = reply[matches[-1].end() :].strip().lstrip(":").strip()
        return (tail.splitlines()[0].strip().rstrip(".") if tail else None), "answer_is"
    return (reply.strip() or None), "reply"


def paragraphs_in(chunk: str) -> list[int]:
    """The `Document {i}` numbers whose header is in `chunk` (recorded, so a report can say at which
    reading step the evidence was read; a token window may hold a paragraph's tail without it)."""
    return [p.index for p in split_paragraphs(chunk) if p.index is not None] if chunk.strip() else []


class TokenChunks(list):
    """The chunks `chunking: tokens` cut, as their texts, with the document's token ids they were cut
    from (`ids`): a hook that needs positions in the token stream (InfMem's retrieval windows) reads
    them here instead of encoding the document a second time."""

    def __init__(self, texts: list[str], ids: list[int]):
        super().__init__(texts)
        self.ids = ids


class SequentialMethod:
    """Subclasses set `name` and the four state hooks; everything else is shared."""

    name = "sequential"
    reading = "read chunk by chunk in one pass, each step's notes carried into the next"

    def __init__(
        self,
        models: Models,
        *,
        chunk_size: int,
        max_update_tokens: int,
        temperature: float,
        chunking: str = "tokens",
        max_answer_tokens: int = 1024,
        max_context_tokens: int | None = None,
        top_p: float = 0.95,
        thinking: bool = False,
        drop_thinking: bool = False,
        prompt_version: str = prompts.DEFAULT_VERSION,
        order: str = "document",
        scorer: Mapping[str, Any] | None = None,
        retry: Mapping[str, Any] | None = None,
    ):
        """Each method sets the first three (its published budgets); `scorer` is read only when
        `order` is not `document` (no embedder is loaded otherwise); `retry`: `parser.serving.retry.RETRY_KEYS`
        (max_attempts, retry_backoff_s, request_timeout_s)."""
        if chunking not in ("tokens", "paragraphs"):
            raise ValueError(f"{self.name}: chunking must be 'tokens' or 'paragraphs', got {chunking!r}")
        self.models = models
        self.lead = RetryingBackend(models.lead, RetryPolicy.from_section(retry))  # every call, as every method's
        self.tokenizer = models.lead_tokenizer
        self.chunk_size = chunk_size
        self.chunking = chunking
        self.max_context_tokens = max_context_tokens
        self.update_sampling = SamplingParams(max_new_tokens=max_update_tokens, temperature=temperature, top_p=top_p)
        self.final_sampling = SamplingParams(max_new_tokens=max_answer_tokens, temperature=temperature, top_p=top_p)
        self.thinking = thinking
        self.drop_thinking = drop_thinking
        # the template opens the thinking itself (Qwen3.5's ends its generation prompt with <think>):
        # a reply with no </think> is then thinking cut short, not an answer
        self.opens_thinking = thinking and self._render("").rstrip().endswith("<think>")
        self.prompt_version = prompt_version
        self.order = check_strategy(order)
        self.scorer = None if order == "document" else build_scorer(scorer, models)

    # -- pieces --------------------------------------------------------------------------
    def chunks(self, context: str) -> list[str]:
        """The chunk texts; under `chunking: tokens` a `TokenChunks`, which keeps the ids they were cut from."""
        if self.chunking == "paragraphs":
            return [c.text for c in chunk_document(context, self.tokenizer, self.chunk_size)]
        ids = self.document_ids(context)
        return TokenChunks([self.tokenizer.decode(ids[i : i + self.chunk_size]) for i in range(0, len(ids), self.chunk_size)], ids)

    def document_ids(self, context: str) -> list[int]:
        """The token ids `chunking: tokens` cuts into chunks: the stripped document, its head and tail
        halves kept when longer than `max_context_tokens`."""
        ids = self.tokenizer.encode(context.strip(), add_special_tokens=False)
        if self.max_context_tokens and len(ids) > self.max_context_tokens:
            head = self.max_context_tokens // 2  # theirs: ids[:L//2] + ids[-L//2:], -L//2 = -ceil(L/2)
            ids = ids[:head] + ids[len(ids) - (self.max_context_tokens - head) :]
        return ids

    def reading_order(self, question: str, chunks: list[str]) -> list[int]:
        if self.scorer is None:
            return list(range(len(chunks)))
        return order_by_scores(self.order, *self.scorer.scores(question, chunks))

    def _render(self, content: str) -> str:
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True, enable_thinking=self.thinking
        )

    async def _call(self, content: str, sampling: SamplingParams, sample_id: str) -> tuple[str, int]:
        """The raw reply (end-of-turn marker removed) and its token count. Raw, so that `</think>` can
        still be found (`visible`); what a method keeps goes through `untrusted`."""
        return await self._generate(self._render(content), sampling, sample_id)

    async def _generate(self, text: str, sampling: SamplingParams, sample_id: str) -> tuple[str, int]:
        """`_call` on a prompt already rendered (InfMem's planner and two-stage calls)."""
        completion = await self.lead.generate(text, sampling, request_id=sample_id)
        reply = CHATML.strip_end(completion.text)
        return reply, len(completion.token_ids) or len(self.tokenizer.encode(reply, add_special_tokens=False))

    def visible(self, reply: str) -> str:
        """The reply without its thinking when thinking is on (or `drop_thinking`): the text after the
        last `</think>`; nothing if a thinking the template or the reply opened was never closed;
        else the reply as it is."""
        if self.thinking or self.drop_thinking:
            return split_thinking(reply, opened=self.opens_thinking)[1]
        return reply

    def untrusted(self, text: str) -> str:
        """A document, question or model-written text on its way into a prompt: never control tokens there."""
        return CHATML.neutralize(text, self.tokenizer)

    def extract(self, reply: str) -> tuple[str | None, str]:
        """(prediction, how) from the final reply as generated; see the module docstring."""
        return extract_answer(self.visible(reply))

    # -- the hooks -------------------------------------------------------------------------
    def new_state(self) -> dict[str, Any]:
        raise NotImplementedError

    def update_prompt(self, question: str, chunk: str, state: dict[str, Any]) -> str:
        raise NotImplementedError

    def absorb(self, reply: str, state: dict[str, Any]) -> dict[str, Any]:
        """Fold one update's reply (`visible`: raw text, thinking removed when on) into `state`,
        keeping only `untrusted` text there; returns extra fields for that update's trace."""
        raise NotImplementedError

    def final_prompt(self, question: str, state: dict[str, Any]) -> str:
        raise NotImplementedError

    def final_record(self, state: dict[str, Any]) -> dict[str, Any]:
        """What the final call answered from, kept in the trace's `extras` (e.g. `final_memory`)."""
        raise NotImplementedError

    async def plan(self, sample: Sample, chunks: list[str], index: int, state: dict[str, Any]) -> tuple[int, int]:
        """Calls made before the update of chunk `index` (InfMem's Retrieval Planner), keeping what
        they found in `state`; returns (calls, output tokens). Default: none."""
        return 0, 0

    def stop_reading(self, state: dict[str, Any]) -> bool:
        """Checked after each `plan`: True skips the rest of the document and answers (InfMem's early
        stop). Default: every chunk is read."""
        return False

    # -- the loop ------------------------------------------------------------------------
    async def run(self, sample: Sample) -> MethodResult:
        started = time.perf_counter()
        sample = dataclasses.replace(sample, context=self.untrusted(sample.context), question=self.untrusted(sample.question))
        chunks = self.chunks(sample.context)
        order = self.reading_order(sample.question, chunks)
        order_s = time.perf_counter() - started
        state = self.new_state()
        updates, tokens, calls = [], 0, 0
        for index in order:
            planned, n = await self.plan(sample, chunks, index, state)
            calls, tokens = calls + planned, tokens + n
            if self.stop_reading(state):
                break
            reply, n = await self._call(self.update_prompt(sample.question, chunks[index], state), self.update_sampling, sample.id)
            calls, tokens = calls + 1, tokens + n
            updates.append({"chunk": index, "tokens": n, **self.absorb(self.visible(reply), state)})
        reply, n = await self._call(self.final_prompt(sample.question, state), self.final_sampling, sample.id)
        tokens += n
        answer, how = self.extract(reply)
        return MethodResult(
            answer=answer,
            steps=calls + 1,  # every call waits for the one before: chunks + 1 without a planner
            wall_s=time.perf_counter() - started,
            lead_output_tokens=tokens,
            trace=SequentialTrace(num_chunks=len(chunks), order=self.order, reading_order=order, order_s=round(order_s, 4),
                                  chunk_paragraphs=[paragraphs_in(c) for c in chunks], final_reply=reply, extracted_by=how,
                                  empty_final_reply=reply == "", updates=updates, extras=self.final_record(state)),
        )

    async def aclose(self) -> None:
        await self.models.aclose()
