"""ReMemR1 (paper Appendix D.4): MemAgent (`parser.methods.memagent`) plus a callback memory.

An update may ask `<recall>query</recall>`, and the memory most similar to the query (TF-IDF over
the model tokenizer's tokens, top-1 even without overlap, as in the reference) is shown with the
next chunk. By default it behaves as its authors' evaluation code (`parser.methods.memagent.rules`,
each rule's source in docs/fidelity.md): its prompts byte for byte (`prompts/v1/rememr1_*.txt`
beside this file), the recall read as their regexes read it and answered top-1, "boxed" answers,
2,048 new tokens a call; `recall_order` picks their eval path (`eval`: the new memory is recallable
at once) or their training path (`training`: only earlier memories). MemAgent's options
(`lenient_extraction`, `keep_memory_on_empty`, `drop_thinking`) apply. Needs scikit-learn (the
baselines extra).

    parser eval method=rememr1
"""
from __future__ import annotations

from typing import Any

from parser.serving.backends.models import Models
from parser.methods.memagent import NO_MEMORY, MemAgentMethod
from parser.methods.memagent.rules import recall_query, remove_recalls
from parser.engine.prompts import PromptSet

NO_RECALLED_MEMORY = "No memory was recalled."
NO_RECALL_RESULT = "None"  # what ReMemR1's eval shows when retrieval fails (an empty vocabulary): Python's None
RECALL_ORDERS = ("eval", "training")
RECALL_TIES = ("latest", "authors")
PROMPTS = PromptSet(__package__, {"rememr1_update": {"question", "memory", "recalled_memory", "chunk"},
                                  "rememr1_final": {"question", "memory", "recalled_memory"}}, "prompts")


class TfidfRecall:
    """Top-1 TF-IDF retrieval over past memories, tokenized by the model's tokenizer, as ReMemR1's
    `TfidfRetriever.top1_retrieve`: the best cosine, even 0 (no word in common).

    Ties (`ties`): "latest" (default) gives the latest memory, the same on every run. "authors"
    breaks them as their code does: the memories in the iteration order of a Python `set` they
    were added to one by one (`history_memory`), `cosine_similarity`, then numpy's default
    (quicksort: not stable) `np.argsort(sims)[::-1][0]`; on today's numpy that is the last tied
    memory in the set's order, which follows the string hash seed (`PYTHONHASHSEED`), so a run
    repeats theirs only under the same seed."""

    def __init__(self, tokenizer: Any, ties: str = "latest"):
        if ties not in RECALL_TIES:
            raise ValueError(f"rememr1: recall_ties must be one of {RECALL_TIES}, got {ties!r}")
        self.tokenizer = tokenizer
        self.ties = ties

    def _tokens(self, text: str) -> list[str]:
        lower = text.lower()
        if hasattr(self.tokenizer, "tokenize"):
            tokens = self.tokenizer.tokenize(lower)
        else:  # a raw `tokenizers.Tokenizer`
            tokens = self.tokenizer.encode(lower, add_special_tokens=False).tokens
        return [t.replace("Ġ", "") for t in tokens]

    def top1(self, query: str, memories: list[str]) -> str | None:
        """None when there is nothing to search or no vocabulary (every memory empty)."""
        if not query or not memories:
            return None
        from sklearn.feature_extraction.text import TfidfVectorizer  # baselines extra

        if self.ties == "authors":
            history: set[str] = set()
            for memory in memories:  # one by one, as theirs `history_memory.add(memory)`
                history.add(memory)
            memories = list(history)
        vectorizer = TfidfVectorizer(tokenizer=self._tokens, lowercase=False, token_pattern=None)
        try:
            matrix = vectorizer.fit_transform(memories)
        except ValueError:  # empty vocabulary
            return None
        if self.ties == "authors":
            import numpy as np
            from sklearn.metrics.pairwise import cosine_similarity

            return memories[int(np.argsort(cosine_similarity(vectorizer.transform([query]), matrix).ravel())[::-1][0])]
        scores = (matrix @ vectorizer.transform([query]).T).toarray().ravel()  # rows are L2-normalised
        return memories[len(scores) - 1 - int(scores[::-1].argmax())]


class ReMemR1Method(MemAgentMethod):
    name = "rememr1"
    templates, update_template = PROMPTS, "rememr1_update"
    final_templates = {"boxed": "rememr1_final"}  # its eval has no recurrent final prompt

    def __init__(self, models: Models, *, max_memory_tokens: int = 2048, max_answer_tokens: int = 2048,
                 answer_mode: str = "boxed", recall_order: str = "eval", recall_ties: str = "latest", **kwargs: Any):
        """ReMemR1's eval budgets (2,048 new tokens a call) and boxed answers; `recall_order`:
        `eval` (their eval script: the new memory joins the history before the recall is answered)
        or `training` (their training path: the recall searches earlier memories only);
        `recall_ties`: `latest` or `authors` (`TfidfRecall`)."""
        if recall_order not in RECALL_ORDERS:
            raise ValueError(f"rememr1: recall_order must be one of {RECALL_ORDERS}, got {recall_order!r}")
        super().__init__(models, max_memory_tokens=max_memory_tokens, max_answer_tokens=max_answer_tokens,
                         answer_mode=answer_mode, **kwargs)
        self.recall = TfidfRecall(self.tokenizer, recall_ties)
        self.recall_order = recall_order

    def new_state(self) -> dict[str, Any]:
        return {"memory": NO_MEMORY, "recalled": NO_RECALLED_MEMORY, "history": []}

    def update_prompt(self, question: str, chunk: str, state: dict[str, Any]) -> str:
        return self.templates.render(self.update_template, self.prompt_version, question=question.strip(),
                                        memory=state["memory"], recalled_memory=state["recalled"], chunk=chunk)

    def absorb(self, reply: str, state: dict[str, Any]) -> dict[str, Any]:
        """Memory = the reply without its `<recall>` blocks, stripped (`remove_recalls`); the history
        is a set of memories (kept in insertion order); a query (`recall_query`) is answered top-1
        from it, before or after the new memory joins it (`recall_order`); no query: "No memory
        was recalled."; a search with no vocabulary: "None", as their eval renders it."""
        query = recall_query(reply)
        if self.recall_order == "training":
            recalled = self.recall.top1(query, state["history"]) if query is not None else None
        self._remember(remove_recalls(reply), state)
        if state["memory"] not in state["history"]:
            state["history"].append(state["memory"])
        if self.recall_order == "eval" and query is not None:
            recalled = self.recall.top1(query, state["history"])
            state["recalled"] = NO_RECALL_RESULT if recalled is None else recalled
        else:
            state["recalled"] = NO_RECALLED_MEMORY if query is None or recalled is None else recalled
        return {"recall_query": query, "recalled": query is not None and recalled is not None}

    def final_prompt(self, question: str, state: dict[str, Any]) -> str:
        return self.templates.render(self.final_template, self.prompt_version, question=question.strip(),
                                        memory=state["memory"], recalled_memory=state["recalled"])
