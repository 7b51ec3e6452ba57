"""Chain-of-Agents (Zhang et al., 2024): worker agents read the chunks one after another, a manager answers.

Worker i sees the question, its chunk and the communication unit (CU) written by worker i-1,
and writes the next CU (at most `max_summary_tokens` new tokens); the manager sees only the
question and the last CU, and answers in `\\boxed{}`. Steps = chunks + 1, as for MemAgent.
Google released no code; the prompts (`prompts/v1/coa_*.txt` beside this file) are ours.

The chunk order is `order:` (`parser.engine.ordering`), the point of Gupta et al.'s "Chow–Liu
ordering for long-context reasoning in Chain-of-Agents": `document`, `dense`, `chow_liu`
(CL-order) or `dfs`. The presets (configs/method/coa*.yaml) use that paper's budgets: 8,000-token
chunks, 8,000-token summaries, temperature 0, top-p 0.95.

    parser eval method=coa method.order=chow_liu   # = method=coa_cl: the "CoA (CL-order)" row
    parser eval --config-name tiny_cpu method=coa_cpu
"""
from __future__ import annotations

from typing import Any

from parser.text.actions import split_thinking
from parser.serving.backends.models import Models
from parser.methods.sequential import SequentialMethod
from parser.engine.prompts import PromptSet

NO_UNIT = "(none yet: you are the first reader)"
PROMPTS = PromptSet(__package__, {"coa_worker": {"question", "unit", "chunk"}, "coa_manager": {"question", "unit"}}, "prompts")


class ChainOfAgentsMethod(SequentialMethod):
    name = "coa"

    def __init__(self, models: Models, *, chunk_size: int = 8000, max_summary_tokens: int = 8000, temperature: float = 0.0,
                 **options: Any):
        """The CL paper's budgets (top-p 0.95 is the shared default); `options`: `SequentialMethod`'s."""
        super().__init__(models, chunk_size=chunk_size, max_update_tokens=max_summary_tokens, temperature=temperature, **options)

    def new_state(self) -> dict[str, Any]:
        return {"unit": NO_UNIT}

    def update_prompt(self, question: str, chunk: str, state: dict[str, Any]) -> str:
        return PROMPTS.render("coa_worker", self.prompt_version, question=question, unit=state["unit"], chunk=chunk)

    def absorb(self, reply: str, state: dict[str, Any]) -> dict[str, Any]:
        unit = split_thinking(reply)[1].strip()
        state["unit"] = self.untrusted(unit) if unit else state["unit"]  # an empty CU hands the previous one on
        return {}

    def final_prompt(self, question: str, state: dict[str, Any]) -> str:
        return PROMPTS.render("coa_manager", self.prompt_version, question=question, unit=state["unit"])

    def final_record(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"final_unit": state["unit"]}
