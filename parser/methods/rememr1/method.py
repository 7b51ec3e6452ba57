"""ReMemR1 (paper Appendix D.4): MemAgent (`parser.methods.memagent`) plus a callback memory.

An update may ask `<recall>query</recall>`, and the earlier memory state most similar to the
query (TF-IDF over the model tokenizer's tokens, as in the reference) is shown with the next
chunk. Prompts follow the authors' evaluation code (`prompts/v1/rememr1_*.txt` beside this file);
the chunk loop, reading order, answer extraction and retries are MemAgent's, hence
`parser.methods.sequential`'s. Needs scikit-learn (the baselines extra).

    python -m eval.run method=rememr1
"""
from __future__ import annotations

from typing import Any

from parser.actions import split_thinking
from parser.backends.models import Models
from parser.methods.memagent import NO_MEMORY, MemAgentMethod
from parser.prompts import PromptSet

NO_RECALLED_MEMORY = "No memory was recalled."
PROMPTS = PromptSet(__package__, {"rememr1_update": {"question", "memory", "recalled_memory", "chunk"},
                                  "rememr1_final": {"question", "memory", "recalled_memory"}}, "prompts")


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


class ReMemR1Method(MemAgentMethod):
    name = "rememr1"
    prompts, update_template, final_template = PROMPTS, "rememr1_update", "rememr1_final"

    def __init__(self, models: Models, **kwargs: Any):
        super().__init__(models, **kwargs)
        self.recall = TfidfRecall(self.tokenizer)

    def new_state(self) -> dict[str, Any]:
        return {"memory": NO_MEMORY, "recalled": NO_RECALLED_MEMORY, "history": []}

    def update_prompt(self, question: str, chunk: str, state: dict[str, Any]) -> str:
        return self.prompts.render(self.update_template, self.prompt_version, question=question, memory=state["memory"],
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
        return self.prompts.render(self.final_template, self.prompt_version, question=question, memory=state["memory"],
                                recalled_memory=state["recalled"])
