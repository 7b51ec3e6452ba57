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
pointing the `lead` model config at them. The chunk loop, the reading order (`order:`, default
`document` as published; `chow_liu` gives "MemAgent (CL-order)"), the answer extraction and the
retries (every call through `parser.retry`, the `retry:` section; one that still fails fails the
sample) are `parser.methods.sequential`'s.
"""
from __future__ import annotations

from typing import Any

from parser import prompts
from parser.actions import split_thinking
from parser.backends.models import Models
from parser.methods.sequential import SequentialMethod

NO_MEMORY = "No previous memory"
NO_RECALLED_MEMORY = "No memory was recalled."


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


class MemAgentMethod(SequentialMethod):
    name = "memagent"
    update_template, final_template = "memagent_update", "memagent_final"

    def __init__(self, models: Models, *, chunk_size: int = 5000, max_memory_tokens: int = 1024, temperature: float = 0.7,
                 **options: Any):
        """The reference eval's budgets; `options`: `SequentialMethod`'s (chunking, order, scorer, ...)."""
        super().__init__(models, chunk_size=chunk_size, max_update_tokens=max_memory_tokens, temperature=temperature, **options)

    def new_state(self) -> dict[str, Any]:
        return {"memory": NO_MEMORY}

    def update_prompt(self, question: str, chunk: str, state: dict[str, Any]) -> str:
        return prompts.BASELINES.render(self.update_template, self.prompt_version, question=question, memory=state["memory"], chunk=chunk)

    def absorb(self, reply: str, state: dict[str, Any]) -> dict[str, Any]:
        state["memory"] = split_thinking(reply)[1].strip() or state["memory"]
        return {}

    def final_prompt(self, question: str, state: dict[str, Any]) -> str:
        return prompts.BASELINES.render(self.final_template, self.prompt_version, question=question, memory=state["memory"])

    def final_record(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"final_memory": state["memory"]}


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
