"""Methods that answer a long-context sample: ParSer and the baselines, behind one interface.

Eval, the latency bench and the demo pick a method by name from the registry, so every method
sees the same samples, is scored by the same metric and reports the same timing fields.

    method = build_method("parser", **cfg)   # or "full_context", "memagent", "rag", ...
    result = await method.run(sample)
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol


@dataclasses.dataclass
class Sample:
    """One eval/training item. `context` is the packed document; the lead never sees it."""

    id: str
    question: str
    answers: list[str]
    context: str
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_record(cls, record: dict[str, Any], source: str = "<record>") -> "Sample":
        """Accept the project's eval rows and MemAgent's (`input`, `answers`, `context`, `index`)."""
        question = record.get("question", record.get("input"))
        answers = record.get("answers", record.get("golden_answers", record.get("outputs")))
        missing = [name for name, v in (("question/input", question), ("answers", answers), ("context", record.get("context"))) if v is None]
        if missing:
            raise ValueError(f"{source}: record is missing field(s) {', '.join(missing)}")
        if isinstance(answers, str):
            answers = [answers]
        sample_id = record.get("id", record.get("index", record.get("_id")))
        if sample_id is None:
            raise ValueError(f"{source}: record has no id/index field")
        meta = {k: v for k, v in record.items() if k not in {"question", "input", "answers", "golden_answers", "outputs", "context", "id"}}
        return cls(id=str(sample_id), question=str(question), answers=[str(a) for a in answers], context=record["context"], meta=meta)


@dataclasses.dataclass
class MethodResult:
    """What every method returns; eval writes `to_dict()` as one JSONL row."""

    answer: str | None
    steps: int  # sequential model rounds on the critical path (ParSer: lead turns; MemAgent: chunks + 1)
    wall_s: float
    lead_output_tokens: int = 0
    subagent_output_tokens: int = 0
    record: dict[str, Any] = dataclasses.field(default_factory=dict)  # method-specific trace (e.g. a trajectory)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Models:
    """The models a method may use, built once from the `models` config (`parser.backends.build_models`).

    ParSer uses both roles; full-context and MemAgent use only `lead`; RAG adds `embedder`.
    Tokenizers are HF tokenizers with a chat template (the engine renders prompts itself).
    """

    lead: Any  # Backend
    lead_tokenizer: Any
    subagent: Any = None  # Backend (often the gateway)
    subagent_tokenizer: Any = None
    embedder: Any = None  # callable list[str] -> np.ndarray (L2-normalised rows), for agentic RAG

    closed: bool = dataclasses.field(default=False, init=False, repr=False)

    async def aclose(self) -> None:
        """Close each backend once (safe to call again: the method and its caller may both close)."""
        if self.closed:
            return
        self.closed = True
        for backend in {id(b): b for b in (self.lead, self.subagent) if b is not None}.values():
            await backend.aclose()


class Method(Protocol):
    name: str

    async def run(self, sample: Sample) -> MethodResult: ...

    async def aclose(self) -> None: ...


_REGISTRY: dict[str, Callable[..., Method]] = {}


def register_method(name: str) -> Callable[[Callable[..., Method]], Callable[..., Method]]:
    def decorate(factory: Callable[..., Method]) -> Callable[..., Method]:
        _REGISTRY[name] = factory
        return factory

    return decorate


def build_method(name: str, models: Models, **kwargs: Any) -> Method:
    """`kwargs` is the method's own config section (e.g. `episode` settings for ParSer)."""
    import parser.baselines  # noqa: F401  (registers the baselines)
    import parser.parser_method  # noqa: F401  (registers "parser")

    if name not in _REGISTRY:
        raise KeyError(f"unknown method {name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name](models=models, **kwargs)
