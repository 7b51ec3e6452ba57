"""Sequential memory agents (paper Appendix D.4): MemAgent and ReMemR1, on the project's backends.

MemAgent reads the document chunk by chunk, in order; after each chunk the model rewrites a
bounded textual memory (up to `max_memory_tokens` new tokens) from (question, previous memory,
chunk), and a final call answers from the memory alone in `\\boxed{}`. Every update depends on
the previous one, so the critical path is `chunks + 1` model calls — the coupling ParSer
removes (the step-count test checks this). ReMemR1 adds a callback: an update may ask
`<recall>query</recall>`, and the earlier memory state most similar to the query (TF-IDF over
the model tokenizer's tokens, as in the reference) is shown with the next chunk.

Prompts and answer extraction follow the authors' evaluation code: chunks are fixed token
windows (`chunking: tokens`, 5,000 tokens; a document longer than `max_context_tokens` keeps
its head and tail halves); the prediction is the last `\\boxed{...}`, else the text after the
last "the answer is", else the final reply. Run trained checkpoints of these methods by
pointing the `lead` model config at them.
"""
from __future__ import annotations

import re
import time
from typing import Any

from parser.actions import split_thinking
from parser.backends.base import SamplingParams
from parser.chat_format import CHATML
from parser import prompts
from parser.chunking import chunk_document
from parser.backends.models import Models
from parser.methods.base import MethodResult, Sample

NO_MEMORY = "No previous memory"
NO_RECALLED_MEMORY = "No memory was recalled."
_ANSWER_IS = re.compile(r"the answer is", re.IGNORECASE)


def split_recalls(text: str) -> tuple[str, str | None]:
    """(text without its `<recall>…</recall>` blocks, the first block's query), as
    `re.sub`/`re.search` of `<recall>(.+?)</recall>` give them, in linear time (the regex
    rescans the rest of the reply from every unclosed `<recall>`: 4 s on 32 KB)."""
    kept, pos, first = [], 0, None
    while (start := text.find("<recall>", pos)) >= 0:
        end = text.find("</recall>", start + 9)  # `.+?`: at least one character inside
        if end < 0:
            break  # no later opener can close either
        if first is None:
            first = text[start + 8 : end]
        kept.append(text[pos:start])
        pos = end + 9
    kept.append(text[pos:])
    return "".join(kept), first


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
    """(prediction, how): the last `\\boxed{}`, else after the last "the answer is", else the reply."""
    _, reply = split_thinking(text)
    boxed = last_boxed(reply)
    if boxed is not None:
        return boxed, "boxed"
    matches = list(_ANSWER_IS.finditer(reply))
    if matches:
        tail = reply[matches[-1].end() :].strip().lstrip(":").strip()
        return (tail.splitlines()[0].strip().rstrip(".") if tail else None), "answer_is"
    return (reply.strip() or None), "reply"


class TfidfRecall:
    """Top-1 TF-IDF retrieval over past memories, tokenized by the model's tokenizer (reference)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def _tokens(self, text: str) -> list[str]:
        lower = text.lower()
        if hasattr(self.tokenizer, "tokenize"):
            tokens = self.tokenizer.tokenize(lower)
        else:  # a raw `tokenizers.Tokenizer`
            tokens = self.tokenizer.encode(lower, add_special_tokens=False).tokens
        return [t.replace("Ġ", "") for t in tokens]

    def top1(self, query: str, memories: list[str]) -> str | None:
        if not query.strip() or not memories:
            return None
        from sklearn.feature_extraction.text import TfidfVectorizer  # baselines extra

        vectorizer = TfidfVectorizer(tokenizer=self._tokens, lowercase=False, token_pattern=None)
        try:
            matrix = vectorizer.fit_transform(memories)
        except ValueError:  # empty vocabulary
            return None
        scores = (matrix @ vectorizer.transform([query]).T).toarray().ravel()  # rows are L2-normalised
        best = int(scores.argmax())
        return memories[best] if scores[best] > 0 else None


class MemAgentMethod:
    name = "memagent"
    update_template, final_template = "memagent_update", "memagent_final"

    def __init__(
        self,
        models: Models,
        *,
        chunk_size: int = 5000,
        chunking: str = "tokens",
        max_memory_tokens: int = 1024,
        max_answer_tokens: int = 1024,
        max_context_tokens: int | None = None,
        temperature: float = 0.7,
        top_p: float = 0.95,
        thinking: bool = False,
        prompt_version: str = prompts.DEFAULT_VERSION,
    ):
        if chunking not in ("tokens", "paragraphs"):
            raise ValueError(f"{self.name}: chunking must be 'tokens' or 'paragraphs', got {chunking!r}")
        self.models = models
        self.tokenizer = models.lead_tokenizer
        self.chunk_size = chunk_size
        self.chunking = chunking
        self.max_context_tokens = max_context_tokens
        self.update_sampling = SamplingParams(max_new_tokens=max_memory_tokens, temperature=temperature, top_p=top_p)
        self.final_sampling = SamplingParams(max_new_tokens=max_answer_tokens, temperature=temperature, top_p=top_p)
        self.thinking = thinking
        self.prompt_version = prompt_version

    # -- pieces --------------------------------------------------------------------------
    def chunks(self, context: str) -> list[str]:
        if self.chunking == "paragraphs":
            return [c.text for c in chunk_document(context, self.tokenizer, self.chunk_size)]
        ids = self.tokenizer.encode(context.strip(), add_special_tokens=False)
        if self.max_context_tokens and len(ids) > self.max_context_tokens:
            half = self.max_context_tokens // 2
            ids = ids[:half] + ids[len(ids) - half :]
        return [self.tokenizer.decode(ids[i : i + self.chunk_size]) for i in range(0, len(ids), self.chunk_size)]

    def _render(self, content: str) -> str:
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True, enable_thinking=self.thinking
        )

    async def _call(self, content: str, sampling: SamplingParams, sample_id: str) -> tuple[str, int]:
        completion = await self.models.lead.generate(self._render(content), sampling, request_id=sample_id)
        text = CHATML.strip_end(completion.text)
        return text, len(completion.token_ids) or len(self.tokenizer.encode(text, add_special_tokens=False))

    # -- the hooks ReMemR1 overrides -------------------------------------------------------
    def new_state(self) -> dict[str, Any]:
        return {"memory": NO_MEMORY}

    def update_prompt(self, question: str, chunk: str, state: dict[str, Any]) -> str:
        return prompts.BASELINES.render(self.update_template, self.prompt_version, question=question, memory=state["memory"], chunk=chunk)

    def absorb(self, reply: str, state: dict[str, Any]) -> dict[str, Any]:
        state["memory"] = split_thinking(reply)[1].strip() or state["memory"]
        return {}

    def final_prompt(self, question: str, state: dict[str, Any]) -> str:
        return prompts.BASELINES.render(self.final_template, self.prompt_version, question=question, memory=state["memory"])

    # -- the loop ------------------------------------------------------------------------
    async def run(self, sample: Sample) -> MethodResult:
        started = time.perf_counter()
        state = self.new_state()
        trace, tokens = [], 0
        chunks = self.chunks(sample.context)
        for index, chunk in enumerate(chunks):
            reply, n = await self._call(self.update_prompt(sample.question, chunk, state), self.update_sampling, sample.id)
            tokens += n
            trace.append({"chunk": index, "tokens": n, **self.absorb(reply, state)})
        reply, n = await self._call(self.final_prompt(sample.question, state), self.final_sampling, sample.id)
        tokens += n
        answer, how = extract_answer(reply)
        return MethodResult(
            answer=answer,
            steps=len(chunks) + 1,
            wall_s=time.perf_counter() - started,
            lead_output_tokens=tokens,
            record={"num_chunks": len(chunks), "final_memory": state["memory"], "final_reply": reply, "extracted_by": how, "updates": trace},
        )

    async def aclose(self) -> None:
        await self.models.aclose()


class ReMemR1Method(MemAgentMethod):
    name = "rememr1"
    update_template, final_template = "rememr1_update", "rememr1_final"

    def __init__(self, models: Models, **kwargs: Any):
        super().__init__(models, **kwargs)
        self.recall = TfidfRecall(self.tokenizer)

    def new_state(self) -> dict[str, Any]:
        return {"memory": NO_MEMORY, "recalled": NO_RECALLED_MEMORY, "history": []}

    def update_prompt(self, question: str, chunk: str, state: dict[str, Any]) -> str:
        return prompts.BASELINES.render(self.update_template, self.prompt_version, question=question, memory=state["memory"],
                                recalled_memory=state["recalled"], chunk=chunk)

    def absorb(self, reply: str, state: dict[str, Any]) -> dict[str, Any]:
        """Memory = the reply without its `<recall>` tags (reference); then answer the recall."""
        body = split_thinking(reply)[1]
        memory, query = split_recalls(body)
        state["memory"] = memory.strip() or state["memory"]
        if state["memory"] not in state["history"]:
            state["history"].append(state["memory"])
        recalled = self.recall.top1(query, state["history"]) if query is not None else None
        state["recalled"] = recalled or NO_RECALLED_MEMORY
        return {"recall_query": query, "recalled": recalled is not None}

    def final_prompt(self, question: str, state: dict[str, Any]) -> str:
        return prompts.BASELINES.render(self.final_template, self.prompt_version, question=question, memory=state["memory"],
                                recalled_memory=state["recalled"])
