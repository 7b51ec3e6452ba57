"""The one small async interface between the episode engine and any model.

Both roles (lead agent, chunk-reading subagents) go through `Backend.generate`; an answer-conditioned
reward scores a given continuation through `Scorer.score` (`parser.serving.backends.scoring` has the
conventions), which every real backend serves too. Real
implementations live beside this file: `http` (SGLang `/generate`, OpenAI-compatible
servers, the sglang-router gateway), `transformers` (in-process CPU, the embedded default)
and `sglang_engine` (in-process GPU). verl's server manager is adapted to it in
`parser.train`. A backend must never raise on a *model's* output; it raises only on
transport/config failures (`BackendError`), which the engine retries and records.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    from parser.text.actions import QueryExclusion

# A prompt is either token ids (the lead agent: the engine owns the exact token stream),
# text already rendered by a chat template (subagents: the router sees the raw prefix), or
# chat messages (only for OpenAI chat servers, which render the template themselves).
Prompt = Sequence[int] | str | list[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()  # generation ends on any of these ids, as on EOS (SGLang's and vLLM's field)
    seed: int | None = None
    return_logprobs: bool = False
    # Constrained decoding, at most one of the two: a JSON schema (as a JSON string) or a regular
    # expression the whole output must match. Every backend honours it (SGLang: sampling_params
    # json_schema/regex; vLLM: structured_outputs; transformers: xgrammar token masks) or raises
    # a non-retryable BackendError; none ignores it silently.
    json_schema: str | None = None
    regex: str | None = None
    # The queries `regex` excludes, kept apart (the lead under `distinct_queries`): a backend that
    # masks tokens itself compiles `exclusion.base` once and applies the exclusion while matching,
    # instead of compiling a new `regex` every turn; any other sends `regex`, which compiles it in.
    exclusion: QueryExclusion | None = None

    def __post_init__(self) -> None:
        if self.json_schema is not None and self.regex is not None:
            raise ValueError("SamplingParams: set json_schema or regex, not both")
        if self.exclusion is not None and self.regex is None:
            raise ValueError("SamplingParams: an exclusion belongs to a regex; set the regex it is part of")

    @property
    def constraint(self) -> tuple[str, str] | None:
        """("json_schema" | "regex", spec), or None when decoding is free."""
        if self.json_schema is not None:
            return "json_schema", self.json_schema
        return ("regex", self.regex) if self.regex is not None else None


@dataclasses.dataclass
class Completion:
    """What one generate call produced.

    `token_ids`/`logprobs` are filled by backends that see tokens (SGLang `/generate`, vLLM
    with `return_token_ids`, transformers, sglang.Engine, verl) and then align one to one. A
    text-only server leaves `token_ids` empty; the engine then re-tokenises `text` and marks the
    trajectory's token view approximate (`Trajectory.token_view_valid=False`), which training refuses.
    """

    text: str
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] | None = None
    finish_reason: str = "stop"  # "stop" (EOS / stop string), "length" (hit max_new_tokens)
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the server's prefix cache, if reported
    worker: str | None = None  # which server answered, if known (gateway locality checks)


# The header carrying a request's routing key ("doc_id:chunk_index" for subagents). It is the one
# the SGLang Model Gateway's header-keyed policies (manual, consistent_hashing) hash, so every
# client, worker and report in the project uses it by default.
ROUTING_HEADER = "X-SMG-Routing-Key"


class BackendError(RuntimeError):
    """Transport or server failure. `retryable` marks 5xx / connection / timeout errors."""

    def __init__(self, message: str, *, retryable: bool = True, status: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.status = status


@runtime_checkable
class Backend(Protocol):
    async def generate(
        self,
        prompt: Prompt,
        sampling: SamplingParams,
        *,
        routing_key: str | None = None,
        request_id: str | None = None,
    ) -> Completion:
        """Generate one completion. `routing_key` (e.g. "doc_id:chunk_index") lets a
        consistent-hashing gateway pin a chunk to one worker; `request_id` keeps a whole
        trajectory on one server (verl's sticky sessions)."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Scorer(Protocol):
    async def score(
        self,
        prompt_ids: Sequence[int],
        continuation_ids: Sequence[int],
        *,
        routing_key: str | None = None,
        request_id: str | None = None,
    ) -> list[float]:
        """log p(continuation_ids[i] | prompt_ids + continuation_ids[:i]) for each i: one forward
        pass at temperature 1, nothing sampled. Token ids only (the scorer's own tokens); raises
        `BackendError` like `generate`, and never returns a value the server did not give."""
        ...
