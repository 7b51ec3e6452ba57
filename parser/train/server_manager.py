"""verl's rollout client (`AgentLoopBase.server_manager`) seen as a ParSer `Backend`.

Why it exists: the episode engine talks to every model through `Backend.generate`; during
training the lead is served by verl's SGLang replicas, reached only through
`server_manager.generate(request_id, prompt_ids=..., sampling_params=...)` (verl 0.9.1
`LLMServerClient` / `FullyAsyncLLMServerClient`), which returns a `TokenOutput` with
`token_ids`, `log_probs` and `stop_reason`. This adapter is that translation and nothing else.

Who decides what:
- verl owns the sampling *policy*: `temperature`, `top_p`, `top_k`, `repetition_penalty` and
  `logprobs` come from the dict verl hands the agent loop (rollout.* for training,
  rollout.val_kwargs.* for validation), so validation really is greedy.
- the engine owns the per-turn *budget*: `max_tokens` = min(2048, what is left of
  rollout.response_length), set on every call (verl would otherwise default it to the whole
  response length).
- one `request_id` per trajectory: verl's sticky sessions keep every turn of a trajectory on
  the replica that already holds its KV prefix. The engine passes the id the agent loop gave
  `EpisodeEngine.run(..., request_id=)` on every turn; the adapter refuses a call without one.

- stop tokens: every lead generation stops at the chat format's `<|im_end|>` and `<|endoftext|>`
  (`stop_token_ids`: `parser.text.chat_format.ChatFormat.stop_token_ids` of the lead tokenizer). SGLang started by verl skips its tokenizer
  (`skip_tokenizer_init`) and then did not stop at Qwen3.5's end of turn on its own; the
  authors' release sends the same two ids with every lead request.
- weight versions: verl's trainer reads each trajectory's `min_global_steps` /
  `max_global_steps` (the oldest and newest weights it was generated with; verl 0.9.1
  `agent_loop_tq.py` copies them from the agent loop's `extra_fields`, `trainer_base.py`
  casts them to int for its staleness metrics and drops nothing silently). The server
  manager reports them per call in `TokenOutput.extra_fields`; the adapter pools them per
  request id and the agent loop takes them with `take_weight_versions(request_id)`.

- scoring (`score`, the InfoMem scorer `parser.info_gain` with `scorer: policy`): verl's own
  `prompt_logprobs` request (what its distillation teacher sends; SGLang and vLLM rollout servers
  both answer it, and so does the CPU rollout server), one token generated and ignored.

- constraints: verl's rollout dict carries no json_schema/regex, so a constrained
  `SamplingParams` is refused (`BackendError(retryable=False)`), never sent without its mask.

It never raises on model output. An `aborted` stop reason (a weight sync interrupted the
request and partial rollout is off) is a transport failure: `BackendError(retryable=True)`.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence
from uuid import uuid4

from parser.serving.types import BackendError, Completion, Prompt, SamplingParams
from parser.serving.backends.scoring import SCORE_TEMPERATURE, check_request

# verl's sampling keys that the adapter passes through untouched.
POLICY_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty", "logprobs")
# verl's per-trajectory weight-version fields (see module docstring).
VERSION_KEYS = ("min_global_steps", "max_global_steps")


def _merge_versions(held: dict[str, int | None], extra: Mapping[str, Any]) -> None:
    """Pool one call's weight versions into a trajectory's: the oldest start, the newest end."""
    step = extra.get("global_steps")
    low, high = extra.get("min_global_steps", step), extra.get("max_global_steps", step)
    if low is not None:
        held["min_global_steps"] = int(low) if held.get("min_global_steps") is None else min(held["min_global_steps"], int(low))
    if high is not None:
        held["max_global_steps"] = int(high) if held.get("max_global_steps") is None else max(held["max_global_steps"], int(high))


class ServerManagerBackend:
    """`Backend` over verl's server manager (token-id prompts only), for one sampling policy."""

    def __init__(self, server_manager: Any, sampling_params: Mapping[str, Any], stop_token_ids: Sequence[int] = ()):
        self.server_manager = server_manager
        self.policy = {k: sampling_params[k] for k in POLICY_KEYS if k in sampling_params}
        self.stop_token_ids = [int(t) for t in stop_token_ids]
        self.versions: dict[str, dict[str, int | None]] = {}  # request_id -> pooled weight versions

    def take_weight_versions(self, request_id: str) -> dict[str, int | None]:
        """The trajectory's `min_global_steps` / `max_global_steps` (None if no call reported one)."""
        held = self.versions.pop(request_id, {})
        return {key: held.get(key) for key in VERSION_KEYS}

    def sampling_dict(self, sampling: SamplingParams) -> dict[str, Any]:
        params = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "logprobs": sampling.return_logprobs,
        }
        params.update(self.policy)
        params["max_tokens"] = sampling.max_new_tokens
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        if sampling.seed is not None:
            params["seed"] = sampling.seed
        return params

    async def generate(
        self,
        prompt: Prompt,
        sampling: SamplingParams,
        *,
        routing_key: str | None = None,
        request_id: str | None = None,
    ) -> Completion:
        if isinstance(prompt, str) or (prompt and not isinstance(prompt[0], int)):
            raise BackendError(
                "ServerManagerBackend takes token-id prompts only (the lead's exact token stream); "
                f"got {type(prompt[0] if prompt else prompt).__name__}",
                retryable=False,
            )
        if not request_id:
            raise BackendError("ServerManagerBackend needs the trajectory's request_id (sticky session)", retryable=False)
        if sampling.constraint is not None:  # verl's rollout dict has no field for it: refuse, never drop
            raise BackendError(f"ServerManagerBackend: verl's rollout takes no {sampling.constraint[0]} constraint; "
                               "constrained decoding is for eval/demo backends (parser.episode.constrain_lead is "
                               "refused for training)", retryable=False)
        prompt_ids = [int(t) for t in prompt]
        params = self.sampling_dict(sampling)
        output = await self.server_manager.generate(request_id, prompt_ids=prompt_ids, sampling_params=params)
        stop_reason = getattr(output, "stop_reason", None)
        if stop_reason in ("aborted", "abort"):
            raise BackendError(f"verl rollout aborted request {request_id} (weight sync?)", retryable=True)
        token_ids = [int(t) for t in output.token_ids]
        logprobs = [float(x) for x in output.log_probs] if output.log_probs else None
        hit_limit = stop_reason == "length" or len(token_ids) >= sampling.max_new_tokens
        extra = getattr(output, "extra_fields", None) or {}
        _merge_versions(self.versions.setdefault(request_id, {}), extra)
        return Completion(
            text="",  # the engine decodes token_ids with the lead tokenizer itself
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason="length" if hit_limit else "stop",
            prompt_tokens=len(prompt_ids),
            cached_tokens=int(extra.get("num_cached_tokens") or 0),
        )

    async def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], *, routing_key: str | None = None,
                    request_id: str | None = None) -> list[float]:
        """The policy as a `Scorer`: verl's `prompt_logprobs` (its distillation teacher's path)
        on a fresh request id. See `policy_prompt_logprobs` for why the base client is called."""
        prompt, continuation = check_request(prompt_ids, continuation_ids, "ServerManagerBackend")
        ids = prompt + continuation
        params = {"max_tokens": 1, "temperature": SCORE_TEMPERATURE, "top_p": 1.0, "top_k": -1, "prompt_logprobs": 0}
        output = await policy_prompt_logprobs(self.server_manager, uuid4().hex, ids, params)
        if getattr(output, "stop_reason", None) in ("aborted", "abort"):
            raise BackendError("verl rollout aborted a scoring request (weight sync?)", retryable=True)
        extra = getattr(output, "extra_fields", None) or {}
        rows, row_ids = extra.get("prompt_logprobs"), extra.get("prompt_ids")
        if not isinstance(rows, list) or not isinstance(row_ids, list) or len(rows) != len(ids) or len(row_ids) != len(ids):
            raise BackendError(f"verl rollout: no prompt_logprobs for the {len(ids)} tokens sent (rollout "
                               f"{type(self.server_manager).__name__}; got {str(extra)[:200]})", retryable=False)
        # verl's contract (vLLM's and SGLang's extractors alike): row p is token p+1's, the last a dummy
        window = range(len(prompt) - 1, len(ids) - 1)
        named = [int(row_ids[p][0]) for p in window]
        if named != continuation:
            raise BackendError(f"verl rollout: prompt_logprobs name tokens {named[:8]}..., not the continuation "
                               f"{continuation[:8]}...", retryable=False)
        values = [rows[p][0] for p in window]
        if any(v is None or not math.isfinite(float(v)) for v in values):
            raise BackendError(f"verl rollout: a continuation token has no finite logprob ({values[:8]})", retryable=False)
        return [float(v) for v in values]

    async def aclose(self) -> None:
        """Nothing to close: verl owns the client."""


async def policy_prompt_logprobs(server_manager: Any, request_id: str, prompt_ids: list[int], params: dict[str, Any]) -> Any:
    """One `generate` that keeps the server's `prompt_logprobs`.

    verl 0.9.1's separate_async trainer hands agent loops a `FullyAsyncLLMServerClient`, whose
    `generate` (the partial-rollout resume loop) rebuilds the `TokenOutput` and keeps only the
    weight-version and cache fields of `extra_fields`: the rollout server's `prompt_logprobs` and
    `prompt_ids` are dropped. A one-token scoring request has nothing to resume, so it goes
    through the base `LLMServerClient.generate` (load balancer, sticky session, the server's output
    as it is); an abort comes back as a stop reason and is retried by the caller.
    """
    try:
        from verl.workers.rollout.llm_server import LLMServerClient
    except ImportError:  # pragma: no cover - verl is installed wherever a server manager exists
        LLMServerClient = None  # type: ignore[assignment]
    if LLMServerClient is not None and isinstance(server_manager, LLMServerClient):
        return await LLMServerClient.generate(server_manager, request_id, prompt_ids=prompt_ids, sampling_params=params)
    return await server_manager.generate(request_id, prompt_ids=prompt_ids, sampling_params=params)
