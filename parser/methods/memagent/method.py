"""MemAgent (paper Appendix D.4), on the project's backends; ReMemR1 (`parser.methods.rememr1`) extends it.

MemAgent reads the document chunk by chunk, in order; after each chunk the model rewrites a
bounded textual memory (up to `max_memory_tokens` new tokens) from (question, previous memory,
chunk), and a final call answers from the memory alone in `\\boxed{}`. Every update depends on
the previous one, so the critical path is `chunks + 1` model calls — the coupling ParSer
removes (the step-count test checks this).

Prompts and answer extraction follow the authors' evaluation code: chunks are fixed token
windows (`chunking: tokens`, 5,000 tokens; a document longer than `max_context_tokens` keeps
its head and tail halves); the prediction is the last `\\boxed{...}`, else the text after the
last "the answer is", else the final reply. Run trained checkpoints of these methods by
pointing the `lead` model config at them. The chunk loop, the reading order (`order:`, default
`document` as published; `chow_liu` gives "MemAgent (CL-order)"), the answer extraction and the
retries (every call through `parser.retry`, the `retry:` section; one that still fails fails the
sample) are `parser.methods.sequential`'s. The prompts are `prompts/v1/memagent_*.txt` beside this file.

    python -m eval.run method=memagent
"""
from __future__ import annotations

from typing import Any

from parser.actions import split_thinking
from parser.backends.models import Models
from parser.methods.sequential import SequentialMethod
from parser.prompts import PromptSet

NO_MEMORY = "No previous memory"
PROMPTS = PromptSet(__package__, {"memagent_update": {"question", "memory", "chunk"}, "memagent_final": {"question", "memory"}},
                    "prompts")


class MemAgentMethod(SequentialMethod):
    name = "memagent"
    prompts, update_template, final_template = PROMPTS, "memagent_update", "memagent_final"

    def __init__(self, models: Models, *, chunk_size: int = 5000, max_memory_tokens: int = 1024, temperature: float = 0.7,
                 **options: Any):
        """The reference eval's budgets; `options`: `SequentialMethod`'s (chunking, order, scorer, ...)."""
        super().__init__(models, chunk_size=chunk_size, max_update_tokens=max_memory_tokens, temperature=temperature, **options)

    def new_state(self) -> dict[str, Any]:
        return {"memory": NO_MEMORY}

    def update_prompt(self, question: str, chunk: str, state: dict[str, Any]) -> str:
        return self.prompts.render(self.update_template, self.prompt_version, question=question, memory=state["memory"], chunk=chunk)

    def absorb(self, reply: str, state: dict[str, Any]) -> dict[str, Any]:
        state["memory"] = split_thinking(reply)[1].strip() or state["memory"]
        return {}

    def final_prompt(self, question: str, state: dict[str, Any]) -> str:
        return self.prompts.render(self.final_template, self.prompt_version, question=question, memory=state["memory"])

    def final_record(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"final_memory": state["memory"]}
