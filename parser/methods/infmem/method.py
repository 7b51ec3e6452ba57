"""InfMem (UCMP13753/InfMem, checkpoint `ucmp137538/infmem-4B`): MemAgent's bounded memory with a
Retrieval Planner before every write and retrieval inside the same document, stopping early.

For each 5,000-token chunk, in document order: a planner call (`prompts/v1/infmem_plan.txt`, with
Qwen-Agent's function-calling system text for `retrievesearch`) either calls
`retrievesearch(query, top_k)` (✿FUNCTION✿ / ✿ARGS✿) or says STOP; the last call's windows
(`retrieval.Bm25Index`: BM25 over 500-token windows of the document) and the chunk go to the
memory rewrite (`infmem_write.txt`), whose text after `</think>` becomes the memory (MemAgent's
`extract_solution`). After `early_stop` (3) plans in a row that say STOP (`rules.stop_count`: a plan
with neither a call nor STOP counts one but never more), reading ends and the final call
(`infmem_final.txt`) answers from the memory: "Therefore, the answer is ..." (`rules.prediction`).
Every call is their two-stage thinking budget: up to `thinking_budget` (1,024) thinking tokens; if
`</think>` has not come, their "…I must stop thinking now.\\n</think>" text is appended; then up to
`max_new_tokens` (1,024) more, sent as raw text (a `/v1/completions` prompt on an HTTP backend).

By default it is their evaluation path (`taskutils/memory_eval/utils/infmem.py`
`async_query_llm_multi_turn` @ 26f1766, scored by `ruler_hqa.py`): prompts byte for byte
(`prompts/v1/`, Apache-2.0, `prompts/v1/NOTICE.txt`), greedy sampling, thinking on; each ambiguity of
their code is a row of docs/fidelity.md ("InfMem"), as is each deliberate difference. Options:
`bm25: legacy | enhanced`, `strict_stop` (off: their substring rule). Steps = calls on the critical
path: plans + writes + 1 (2 × chunks + 1 when it never stops; with thinking on each call is two
requests). The record (trace `extras`) keeps every plan, its searches (query, top-k, windows) and
where reading stopped.

    vllm serve ucmp137538/infmem-4B      # or SGLang; any OpenAI-compatible server at :8000
    parser eval method=infmem backend@models=infmem_4b report.backbone=InfMem-4B   # configs/backend/infmem_4b.yaml
    parser eval --config-name tiny_cpu method=infmem_cpu limit=1 runs=1   # CPU: exercises the loop only
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from parser.engine.prompts import PromptSet
from parser.methods.base import Sample
from parser.methods.infmem.retrieval import VARIANTS, Bm25Index
from parser.methods.infmem.rules import (FORCED_THINK_END, TOOL, call_arguments, parse_plan, prediction,
                                         stop_count)
from parser.methods.memagent import NO_MEMORY
from parser.methods.memagent.rules import after_thinking
from parser.methods.sequential import SequentialMethod
from parser.serving.backends.models import Models
from parser.serving.types import SamplingParams

# their field names, so each file is their template's text as it is
PROMPTS = PromptSet(__package__, {
    "infmem_planner_system": set(),  # Qwen-Agent's QwenFnCallPrompt text for the retrievesearch schema
    "infmem_plan": {"prompt", "retrieval_history", "memory"},  # TEMPLATE_CALL_OR_ANSWER
    "infmem_write": {"prompt", "retrieve", "chunk", "memory"},  # TEMPLATE_RETREIVE_RECURRENT
    "infmem_final": {"prompt", "memory"},  # TEMPLATE_FINAL
}, "prompts")
_LEADING_THINK = re.compile(r"\s*<think>")


class InfMemMethod(SequentialMethod):
    name = "infmem"

    def __init__(self, models: Models, *, chunk_size: int = 5000, max_new_tokens: int = 1024, thinking: bool = True,
                 thinking_budget: int = 1024, temperature: float = 0.0, top_p: float = 1.0, bm25: str = "enhanced",
                 retrieve_window: int = 500, retrieve_overlap: int = 100, per_chunk: int = 2, dedup_jaccard: float = 0.8,
                 candidates: int = 6, legacy_top_k: int = 4, default_top_k: int = 8, early_stop: int = 3,
                 strict_stop: bool = False, **options: Any):
        """Their evaluation settings (configs/method/infmem.yaml says where each comes from);
        `options`: `SequentialMethod`'s (`max_context_tokens`, `prompt_version`, `retry`)."""
        super().__init__(models, chunk_size=chunk_size, max_update_tokens=max_new_tokens, max_answer_tokens=max_new_tokens,
                         temperature=temperature, top_p=top_p, thinking=thinking, **options)
        if self.chunking != "tokens" or self.order != "document" or self.drop_thinking:
            raise ValueError("infmem: reads fixed token chunks in document order (its retrieval windows and the "
                             "current-chunk exclusion are positions in the token stream) and cuts every reply at its "
                             "last </think>: chunking, order and drop_thinking cannot change")
        if bm25 not in VARIANTS:
            raise ValueError(f"infmem: bm25 must be one of {VARIANTS}, got {bm25!r}")
        if early_stop < 1 or thinking_budget < 1:
            raise ValueError(f"infmem: early_stop and thinking_budget must be >= 1, got {early_stop}, {thinking_budget}")
        self.thinking_budget = thinking_budget
        self.bm25 = bm25
        self.index_settings = dict(variant=bm25, window=retrieve_window, overlap=retrieve_overlap, per_chunk=per_chunk,
                                   dedup_jaccard=dedup_jaccard, candidates=candidates, legacy_top_k=legacy_top_k)
        self.default_top_k = default_top_k
        self.early_stop = early_stop
        self.strict_stop = strict_stop

    # -- calls ---------------------------------------------------------------------------
    async def _complete(self, text: str, sampling: SamplingParams, sample_id: str) -> tuple[str, int]:
        """Their `call_llm_text`: with thinking on, stage 1 gets `thinking_budget` tokens; without a
        `</think>` their forced text closes it; stage 2 continues the same text for `sampling`'s
        budget; the reply is both stages joined and stripped. Thinking off: one call, unstripped."""
        if not self.thinking:
            return await self._generate(text, sampling, sample_id)
        think, first = await self._generate(text, dataclasses.replace(sampling, max_new_tokens=self.thinking_budget), sample_id)
        if "</think>" not in think:
            think = think.rstrip() + FORCED_THINK_END
        answer, second = await self._generate(text + self._continued(think), sampling, sample_id)
        return (think + answer.strip()).strip(), first + second

    def _continued(self, think: str) -> str:
        """Stage 1's text as stage 2's prompt continues it: a leading `<think>` and the last
        `</think>` stay the template's tokens; any other control string in it is shown as text."""
        lead = _LEADING_THINK.match(think)
        start = lead.end() if lead else 0
        head, end, tail = think[start:].rpartition("</think>")
        return think[:start] + self.untrusted(head) + end + self.untrusted(tail)

    async def _call(self, content: str, sampling: SamplingParams, sample_id: str) -> tuple[str, int]:
        return await self._complete(self._render(content), sampling, sample_id)

    def _render_planner(self, content: str) -> str:
        """Their `_process_messages_to_text` with the tool: Qwen-Agent's system text, then the plan."""
        system = PROMPTS.render("infmem_planner_system", self.prompt_version)
        return self.tokenizer.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": content}],
                                                  tokenize=False, add_generation_prompt=True, enable_thinking=self.thinking)

    # -- the hooks -------------------------------------------------------------------------
    def new_state(self) -> dict[str, Any]:
        return {"memory": NO_MEMORY, "index": None, "history": [], "stops": 0, "retrieved": "", "retrieved_windows": 0,
                "plans": [],
                "stopped_at": None}

    def _history(self, step: int, steps: int, history: list[tuple[Any, Any]]) -> str:
        """Their `retrieval_history_str`: the step line, then each search as the model wrote it."""
        lines = "\n".join(f"Step {i}: query={query!r}, top_k={top_k}" for i, (query, top_k) in enumerate(history, 1))
        return self.untrusted(f"Current retrieval step: {step}  Maximum allowed retrieval steps: {steps}\n" + lines)

    async def plan(self, sample: Sample, chunks: list[str], index: int, state: dict[str, Any]) -> tuple[int, int]:
        """The Retrieval Planner for chunk `index`, then the searches it called (the last one's windows
        are what the write sees), and the early-stop counter."""
        if state["index"] is None:  # once per document, over the ids the chunks were cut from (`TokenChunks`: chunking is tokens)
            state["index"] = Bm25Index.build(chunks.ids, self.tokenizer.decode,
                                             chunk_size=self.chunk_size, **self.index_settings)
        question = sample.question.strip()
        content = PROMPTS.render("infmem_plan", self.prompt_version, prompt=question, memory=state["memory"],
                                 retrieval_history=self._history(index + 1, len(chunks), state["history"]))
        reply, tokens = await self._complete(self._render_planner(content), self.update_sampling, sample.id)
        plan = parse_plan(reply, strict=self.strict_stop)
        state["stops"] = stop_count(state["stops"], plan)
        state["retrieved"], state["retrieved_windows"], searches = "", 0, []
        for name, raw in plan.calls:
            if name != TOOL:  # theirs runs only retrievesearch; other calls are read and ignored
                continue
            query, top_k = call_arguments(raw, question, self.default_top_k)
            state["history"].append((query, top_k))
            searched, used, found = state["index"].search(query, top_k, question=question, current_chunk=index)
            state["retrieved"] = "\n\n".join(f"[Retrieved #{rank}] {text}" for rank, text in enumerate(found, 1))
            state["retrieved_windows"] = len(found)
            searches.append({"query": searched, "top_k": used, "windows": found})
        if self.stop_reading(state):
            state["stopped_at"] = index
        state["plans"].append({"chunk": index, "stop": plan.stop, "calls": [name for name, _ in plan.calls],
                               "searches": searches, "stop_count": state["stops"], "tokens": tokens})
        return 1, tokens

    def stop_reading(self, state: dict[str, Any]) -> bool:
        return state["stops"] >= self.early_stop

    def update_prompt(self, question: str, chunk: str, state: dict[str, Any]) -> str:
        return PROMPTS.render("infmem_write", self.prompt_version, prompt=question.strip(), retrieve=state["retrieved"],
                              chunk=chunk, memory=state["memory"])

    def visible(self, reply: str) -> str:
        """Their `extract_solution`: the text after the last `</think>`, stripped; else the reply."""
        return after_thinking(reply)

    def absorb(self, reply: str, state: dict[str, Any]) -> dict[str, Any]:
        state["memory"] = self.untrusted(reply)
        return {"retrieved": state["retrieved_windows"]}  # windows the write saw

    def final_prompt(self, question: str, state: dict[str, Any]) -> str:
        return PROMPTS.render("infmem_final", self.prompt_version, prompt=question.strip(), memory=state["memory"])

    def extract(self, reply: str) -> tuple[str | None, str]:
        return prediction(reply), "recurrent"

    def final_record(self, state: dict[str, Any]) -> dict[str, Any]:
        stopped = state["stopped_at"]
        return {"final_memory": state["memory"], "bm25": self.bm25, "plans": state["plans"],
                "stopped_early": stopped is not None, "stopped_at_chunk": stopped}
