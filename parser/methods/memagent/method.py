"""MemAgent (paper Appendix D.4), on the project's backends; ReMemR1 (`parser.methods.rememr1`) builds on it.

MemAgent reads the document chunk by chunk, in order; after each chunk the model rewrites a
bounded textual memory (up to `max_memory_tokens` new tokens) from (question, previous memory,
chunk), and a final call answers from the memory alone. Every update depends on the previous
one, so the critical path is `chunks + 1` model calls — the coupling ParSer removes (the
step-count test checks this).

By default it behaves as its authors' evaluation code (`rules.py` beside this file, each rule's
source in docs/fidelity.md): the prompts byte for byte (`prompts/v1/memagent_*.txt`: trailing
newline kept, question stripped), chunks of fixed token windows (`chunking: tokens`, 5,000 tokens;
a document longer than `max_context_tokens` L keeps its first L//2 and last L - L//2 tokens), the memory becomes the
reply as it is (even empty), and the answer extracted as their run scripts score it: the
"recurrent" mode (`answer_mode: recurrent`: "Therefore, the answer is ..."). The project's
improvements are named options, off by default: `lenient_extraction` (boxed, else "the answer
is", else the reply), `keep_memory_on_empty` (an empty or blank reply keeps the previous memory),
`drop_thinking` (`SequentialMethod`). Untrusted text (the document, the question, each memory) is
shown as text by default: a control-token string of the tokenizer in it (`<|im_end|>`) gets a
WORD JOINER after its first character (`CHATML.neutralize`, docs/security.md), which changes the
prompt where such a string occurs; `untrusted_text: verbatim` sends the authors' prompts byte for
byte instead, and then a document can end the user turn and write its own (their code does).
Run trained checkpoints by pointing the `lead` model config
at them. The chunk loop, the reading order (`order:`, default `document` as published; `chow_liu`
gives "MemAgent (CL-order)") and the retries (every call through `parser.serving.retry`, the `retry:`
section; one that still fails fails the sample) are `parser.methods.sequential`'s.

    parser eval method=memagent
"""
from __future__ import annotations

from typing import Any

from parser.serving.backends.models import Models
from parser.methods.memagent.rules import ANSWER_MODES, memagent_memory, prediction
from parser.methods.sequential import SequentialMethod, extract_answer
from parser.engine.prompts import PromptSet

NO_MEMORY = "No previous memory"
UNTRUSTED_TEXT = ("neutralize", "verbatim")
PROMPTS = PromptSet(__package__, {
    "memagent_update": {"question", "memory", "chunk"},
    "memagent_final": {"question", "memory"},  # boxed: MemAgent's training prompt, its "recurrent-boxed" eval
    "memagent_final_recurrent": {"question", "memory"},  # MemAgent's "recurrent" eval, what its run scripts use
}, "prompts")


class MemAgentMethod(SequentialMethod):
    name = "memagent"
    templates, update_template, final_template = PROMPTS, "memagent_update", "memagent_final"

    final_templates = {"recurrent": "memagent_final_recurrent", "boxed": "memagent_final"}

    def __init__(self, models: Models, *, chunk_size: int = 5000, max_memory_tokens: int = 1024, max_answer_tokens: int = 1024,
                 temperature: float = 0.7, answer_mode: str = "recurrent", lenient_extraction: bool = False,
                 keep_memory_on_empty: bool = False, untrusted_text: str = "neutralize", **options: Any):
        """The authors' eval budgets and answer mode; `untrusted_text`: neutralize (default) or
        verbatim (see the module docstring); `options`: `SequentialMethod`'s (chunking, order,
        scorer, thinking, drop_thinking, ...)."""
        if answer_mode not in ANSWER_MODES or answer_mode not in self.final_templates:
            raise ValueError(f"{self.name}: answer_mode must be one of {sorted(self.final_templates)}, got {answer_mode!r}")
        if untrusted_text not in UNTRUSTED_TEXT:
            raise ValueError(f"{self.name}: untrusted_text must be one of {UNTRUSTED_TEXT}, got {untrusted_text!r}")
        self.verbatim = untrusted_text == "verbatim"
        super().__init__(models, chunk_size=chunk_size, max_update_tokens=max_memory_tokens, max_answer_tokens=max_answer_tokens,
                         temperature=temperature, **options)
        self.answer_mode = answer_mode
        self.final_template = self.final_templates[answer_mode]
        self.lenient_extraction = lenient_extraction
        self.keep_memory_on_empty = keep_memory_on_empty

    def new_state(self) -> dict[str, Any]:
        return {"memory": NO_MEMORY}

    def untrusted(self, text: str) -> str:
        """`SequentialMethod.untrusted`, or the text as it is with `untrusted_text: verbatim`."""
        return text if self.verbatim else super().untrusted(text)

    def update_prompt(self, question: str, chunk: str, state: dict[str, Any]) -> str:
        return self.templates.render(self.update_template, self.prompt_version, question=question.strip(),
                                        memory=state["memory"], chunk=chunk)

    def _remember(self, memory: str, state: dict[str, Any]) -> None:
        """The new memory, unless it is blank and `keep_memory_on_empty` keeps the previous one."""
        if not (self.keep_memory_on_empty and not memory.strip()):
            state["memory"] = self.untrusted(memory)

    def absorb(self, reply: str, state: dict[str, Any]) -> dict[str, Any]:
        self._remember(memagent_memory(reply), state)
        return {}

    def final_prompt(self, question: str, state: dict[str, Any]) -> str:
        return self.templates.render(self.final_template, self.prompt_version, question=question.strip(), memory=state["memory"])

    def extract(self, reply: str) -> tuple[str | None, str]:
        """The authors' extraction for `answer_mode` (`rules.prediction`), or the project's
        lenient one (`lenient_extraction`); from the text after the thinking when thinking is on."""
        reply = self.visible(reply)
        return extract_answer(reply) if self.lenient_extraction else prediction(reply, self.answer_mode)

    def final_record(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"final_memory": state["memory"]}
