"""Sequential memory agents (paper Appendix D.4): MemAgent and ReMemR1, on the project's backends.

MemAgent reads the document chunk by chunk, in order; after each chunk the model rewrites a
bounded textual memory (up to `max_memory_tokens` new tokens) from (question, previous memory,
chunk), and a final call answers from the memory alone in `\\boxed{}`. Every update depends on
the previous one, so the critical path is `chunks + 1` model calls — the coupling ParSer
removes (the step-count test checks this). ReMemR1 adds a callback: an update may ask
`<recall>query</recall>`, and the earlier memory state most similar to the query (TF-IDF over
the model tokenizer's tokens, as in the reference) is shown with the next chunk.

By default both behave as their authors' evaluation code (`parser.methods.memagent_rules`, each
rule's source in docs/fidelity.md): the prompts byte for byte (trailing newline kept, question
stripped), chunks of fixed token windows (`chunking: tokens`, 5,000 tokens; a document longer than
`max_context_tokens` keeps its head and tail halves), the memory becomes the reply as it is (even
empty), ReMemR1's recall read as their regexes read it and answered top-1 even without overlap,
and the answer extracted as their run scripts score it: MemAgent in the "recurrent" mode
(`answer_mode: recurrent`: "Therefore, the answer is ..."), ReMemR1 in "boxed" mode, with
2,048 new tokens a call. The project's improvements are named options, off by default:
`lenient_extraction` (boxed, else "the answer is", else the reply), `keep_memory_on_empty` (an
empty or blank reply keeps the previous memory), `drop_thinking` (`SequentialMethod`); and
ReMemR1's `recall_order` picks their eval path (`eval`: the new memory is recallable at once) or
their training path (`training`: only earlier memories). Run trained checkpoints by pointing the
`lead` model config at them. The chunk loop, the reading order (`order:`, default `document` as
published; `chow_liu` gives "MemAgent (CL-order)") and the retries (every call through
`parser.retry`, the `retry:` section; one that still fails fails the sample) are
`parser.methods.sequential`'s.
"""
from __future__ import annotations

from typing import Any

from parser import prompts
from parser.backends.models import Models
from parser.methods.memagent_rules import ANSWER_MODES, memagent_memory, prediction, recall_query, remove_recalls
from parser.methods.sequential import SequentialMethod, extract_answer

NO_MEMORY = "No previous memory"
NO_RECALLED_MEMORY = "No memory was recalled."


NO_RECALL_RESULT = "None"  # what ReMemR1's eval shows when retrieval fails (an empty vocabulary): Python's None
RECALL_ORDERS = ("eval", "training")


class TfidfRecall:
    """Top-1 TF-IDF retrieval over past memories, tokenized by the model's tokenizer, as ReMemR1's
    `TfidfRetriever.top1_retrieve`: the best cosine, even 0 (no word in common); ties go to the
    latest memory (theirs: the last of numpy's argsort over a `set`, whose order is the hash seed's)."""

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
        """None when there is nothing to search or no vocabulary (every memory empty)."""
        if not query or not memories:
            return None
        from sklearn.feature_extraction.text import TfidfVectorizer  # baselines extra

        vectorizer = TfidfVectorizer(tokenizer=self._tokens, lowercase=False, token_pattern=None)
        try:
            matrix = vectorizer.fit_transform(memories)
        except ValueError:  # empty vocabulary
            return None
        scores = (matrix @ vectorizer.transform([query]).T).toarray().ravel()  # rows are L2-normalised
        return memories[len(scores) - 1 - int(scores[::-1].argmax())]


class MemAgentMethod(SequentialMethod):
    name = "memagent"
    update_template, final_template = "memagent_update", "memagent_final"

    final_templates = {"recurrent": "memagent_final_recurrent", "boxed": "memagent_final"}

    def __init__(self, models: Models, *, chunk_size: int = 5000, max_memory_tokens: int = 1024, max_answer_tokens: int = 1024,
                 temperature: float = 0.7, answer_mode: str = "recurrent", lenient_extraction: bool = False,
                 keep_memory_on_empty: bool = False, **options: Any):
        """The authors' eval budgets and answer mode; `options`: `SequentialMethod`'s (chunking, order,
        scorer, thinking, drop_thinking, ...)."""
        if answer_mode not in ANSWER_MODES or answer_mode not in self.final_templates:
            raise ValueError(f"{self.name}: answer_mode must be one of {sorted(self.final_templates)}, got {answer_mode!r}")
        super().__init__(models, chunk_size=chunk_size, max_update_tokens=max_memory_tokens, max_answer_tokens=max_answer_tokens,
                         temperature=temperature, **options)
        self.answer_mode = answer_mode
        self.final_template = self.final_templates[answer_mode]
        self.lenient_extraction = lenient_extraction
        self.keep_memory_on_empty = keep_memory_on_empty

    def new_state(self) -> dict[str, Any]:
        return {"memory": NO_MEMORY}

    def update_prompt(self, question: str, chunk: str, state: dict[str, Any]) -> str:
        return prompts.BASELINES.render(self.update_template, self.prompt_version, question=question.strip(),
                                        memory=state["memory"], chunk=chunk)

    def _remember(self, memory: str, state: dict[str, Any]) -> None:
        """The new memory, unless it is blank and `keep_memory_on_empty` keeps the previous one."""
        if not (self.keep_memory_on_empty and not memory.strip()):
            state["memory"] = self.untrusted(memory)

    def absorb(self, reply: str, state: dict[str, Any]) -> dict[str, Any]:
        self._remember(memagent_memory(reply), state)
        return {}

    def final_prompt(self, question: str, state: dict[str, Any]) -> str:
        return prompts.BASELINES.render(self.final_template, self.prompt_version, question=question.strip(), memory=state["memory"])

    def extract(self, reply: str) -> tuple[str | None, str]:
        """The authors' extraction for `answer_mode` (`memagent_rules.prediction`), or the project's
        lenient one (`lenient_extraction`); from the text after the thinking when thinking is on."""
        reply = self.visible(reply)
        return extract_answer(reply) if self.lenient_extraction else prediction(reply, self.answer_mode)

    def final_record(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"final_memory": state["memory"]}


class ReMemR1Method(MemAgentMethod):
    name = "rememr1"
    update_template = "rememr1_update"
    final_templates = {"boxed": "rememr1_final"}  # its eval has no recurrent final prompt

    def __init__(self, models: Models, *, max_memory_tokens: int = 2048, max_answer_tokens: int = 2048,
                 answer_mode: str = "boxed", recall_order: str = "eval", **kwargs: Any):
        """ReMemR1's eval budgets (2,048 new tokens a call) and boxed answers; `recall_order`:
        `eval` (their eval script: the new memory joins the history before the recall is answered)
        or `training` (their training path: the recall searches earlier memories only)."""
        if recall_order not in RECALL_ORDERS:
            raise ValueError(f"rememr1: recall_order must be one of {RECALL_ORDERS}, got {recall_order!r}")
        super().__init__(models, max_memory_tokens=max_memory_tokens, max_answer_tokens=max_answer_tokens,
                         answer_mode=answer_mode, **kwargs)
        self.recall = TfidfRecall(self.tokenizer)
        self.recall_order = recall_order

    def new_state(self) -> dict[str, Any]:
        return {"memory": NO_MEMORY, "recalled": NO_RECALLED_MEMORY, "history": []}

    def update_prompt(self, question: str, chunk: str, state: dict[str, Any]) -> str:
        return prompts.BASELINES.render(self.update_template, self.prompt_version, question=question.strip(),
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
        return prompts.BASELINES.render(self.final_template, self.prompt_version, question=question.strip(),
                                        memory=state["memory"], recalled_memory=state["recalled"])
