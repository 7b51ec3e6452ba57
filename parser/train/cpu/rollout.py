"""A small transformers rollout server, registered in verl as rollout type `parser_cpu`.

Why it exists: verl's standalone rollout replicas are SGLang/vLLM/TRT-LLM servers, all of
which need a GPU. This is the same shape on a CPU, built from verl's own parts:

- `CpuRolloutReplica` (a verl `RolloutReplica`, registered in `RolloutReplicaRegistry`) owns
  one `TransformersRolloutServer` Ray actor per replica — the handle verl's load balancer
  routes `generate` calls to, like `SGLangHttpServer`;
- the replica's rollout workers are verl's `CheckpointEngineWorker` with `CpuServerAdapter`
  as the server adapter: the checkpoint engine receives the trainer's weights there and the
  adapter hands them to the server (SGLang's adapter does this over CUDA IPC; here Ray's
  object store), tagged with the trainer step they came from;
- the server generates with `parser.serving.backends.transformers.TransformersBackend` (token ids in,
  token ids + log-probs out, sampling as verl sends it) and reports `global_steps`, the
  weight version each request ran on, which verl's staleness accounting reads; it answers
  verl's `prompt_logprobs: 0` (the policy as the InfoMem scorer) from one teacher-forced pass.

    actor_rollout_ref.rollout.name=parser_cpu   # with VERL_USE_EXTERNAL_MODULES=parser.train.cpu

Concurrent requests decode as one batch (the backend's worker). A request never mixes weight
versions: a weight load waits for the requests in flight and holds new ones until it is done,
and new requests also wait while verl has paused the replica (`abort_all_requests` ...
`resume_generation`).
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngineWorker
from verl.single_controller.ray import RayClassWithInitArgs
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

from parser.serving.types import SamplingParams

ROLLOUT_NAME = "parser_cpu"


def server_name(replica_rank: int) -> str:
    return f"parser_cpu_rollout_server_{replica_rank}"


def sampling_from_verl(params: dict[str, Any], default_max_tokens: int) -> SamplingParams:
    """verl/SGLang sampling dict -> the project's SamplingParams (greedy when temperature is 0)."""
    return SamplingParams(
        max_new_tokens=int(params.get("max_tokens") or params.get("max_new_tokens") or default_max_tokens),
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
        top_k=int(params.get("top_k", -1)),
        seed=params.get("seed"),
        return_logprobs=bool(params.get("logprobs")),
    )


class TransformersRolloutServer:
    """One rollout replica's engine: a causal LM on the CPU behind verl's server-actor API."""

    def __init__(self, rollout_config: Any, model_config: Any, replica_rank: int):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from parser.serving.backends.transformers import TransformersBackend

        path = getattr(model_config, "local_path", None) or model_config.path
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        # rollout.seed: the sampling stream of a run, one per replica
        seed = int(getattr(rollout_config, "seed", 0) or 0) + replica_rank
        self.backend = TransformersBackend(model, tokenizer, name=server_name(replica_rank), seed=seed)
        self.response_length = int(rollout_config.response_length)
        self.global_steps: Optional[int] = None
        # One weight version per request, many requests at once (the backend batches them): a
        # weight load waits for the requests in flight and holds new ones until it is done.
        self._weights = asyncio.Condition()
        self._in_flight = 0
        self._loading = False
        self._open = asyncio.Event()
        self._open.set()

    def ready(self) -> bool:
        return True

    async def generate(self, prompt_ids: Any, sampling_params: dict[str, Any], request_id: str, **_: Any) -> TokenOutput:
        await self._open.wait()
        sampling = sampling_from_verl(sampling_params, self.response_length)
        stop_ids = {int(t) for t in sampling_params.get("stop_token_ids") or ()}
        ids = [int(t) for t in prompt_ids]
        prompt_logprobs = sampling_params.get("prompt_logprobs")
        if prompt_logprobs not in (None, 0):
            raise ValueError(f"{ROLLOUT_NAME}: prompt_logprobs={prompt_logprobs}; only 0 (each prompt token's own) is served")
        async with self._weights:
            await self._weights.wait_for(lambda: not self._loading)
            self._in_flight += 1
            version = self.global_steps
        try:  # scored and generated under one weight version
            self.backend.eos_ids |= stop_ids  # the lead's end-of-turn ids (same for every request)
            scores = []
            if prompt_logprobs is not None and len(ids) > 1:
                scores = await asyncio.to_thread(self.backend.score_ids, ids[:1], ids[1:])
            completion = await asyncio.wrap_future(self.backend.submit(ids, sampling, key=request_id))
        finally:
            async with self._weights:
                self._in_flight -= 1
                self._weights.notify_all()
        extra = {"global_steps": version, "num_cached_tokens": completion.cached_tokens}
        if prompt_logprobs is not None:  # verl's contract: row p is token p+1's, then a dummy row
            extra["prompt_ids"] = [[t] for t in ids[1:]] + [[0]]
            extra["prompt_logprobs"] = [[lp] for lp in scores] + [[0.0]]
        return TokenOutput(
            token_ids=completion.token_ids,
            log_probs=completion.logprobs,
            stop_reason=completion.finish_reason,
            extra_fields=extra,
        )

    async def load_weights(self, weights: dict[str, torch.Tensor], global_steps: Optional[int]) -> None:
        def load():
            model = self.backend.model
            missing, unexpected = model.load_state_dict(weights, strict=False)
            tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
            if unexpected or set(missing) - tied:
                raise RuntimeError(f"weight sync: unexpected {unexpected}, missing {sorted(set(missing) - tied)}")
            if tied:
                model.tie_weights()
            self.backend._entries.clear()  # cached prefixes were computed with the old weights

        async with self._weights:
            self._loading = True
            await self._weights.wait_for(lambda: self._in_flight == 0)
        try:  # on the backend's worker thread, which owns the model
            await asyncio.to_thread(self.backend.run_exclusive, load)
            self.global_steps = global_steps
        finally:
            async with self._weights:
                self._loading = False
                self._weights.notify_all()

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        self._open.clear()

    async def resume_generation(self) -> None:
        self._open.set()

    async def clear_kv_cache(self) -> None:
        await self.backend.aclose()

    # Nothing to free on a CPU: weights and caches live in host memory.
    async def wake_up(self) -> None: ...
    async def sleep(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def start_profile(self, **_: Any) -> None: ...
    async def stop_profile(self) -> None: ...


class CpuServerAdapter(BaseRollout):
    """The rollout worker's handle on its replica's server: weights in, nothing else."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any = None, replica_rank: int = 0, **_: Any):
        super().__init__(config, model_config, device_mesh)
        self.replica_rank = replica_rank
        self.is_leader_rank = True

    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps: int | None = None, **_: Any):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"{ROLLOUT_NAME} rollout takes full named tensors, not {wire_format!r}")
        state = {}
        if hasattr(weights, "__aiter__"):
            async for name, tensor in weights:
                state[name] = tensor.clone()
        else:
            state = {name: tensor.clone() for name, tensor in weights}
        server = ray.get_actor(server_name(self.replica_rank))
        await server.load_weights.remote(state, global_steps)

    async def resume(self, tags: list[str]) -> None: ...
    async def release(self) -> None: ...


class CpuRolloutWorker(CheckpointEngineWorker):
    """verl's rollout-side checkpoint-engine worker, with the CPU server adapter."""

    def __init__(self, rollout_config: Any, model_config: Any, replica_rank: int = 0, **_: Any):
        adapter = CpuServerAdapter(rollout_config, model_config, replica_rank=replica_rank)
        super().__init__(rollout_config, model_config, server_adapter=adapter)


class CpuRolloutReplica(RolloutReplica):
    """A standalone rollout replica on the CPU (tensor parallel 1: one worker, one server)."""

    def get_ray_class_with_init_args(self) -> RayClassWithInitArgs:
        return RayClassWithInitArgs(
            cls=ray.remote(CpuRolloutWorker),
            rollout_config=self.config,
            model_config=self.model_config,
            replica_rank=self.replica_rank,
        )

    async def launch_servers(self) -> None:
        if self.world_size != 1:
            raise ValueError(f"rollout.name={ROLLOUT_NAME} runs one process per replica: set "
                             "rollout.tensor_model_parallel_size=1 (and data/pipeline parallel 1)")
        server = ray.remote(TransformersRolloutServer).options(
            name=server_name(self.replica_rank), max_concurrency=self.max_concurrency, num_cpus=0,
        ).remote(self.config, self.model_config, self.replica_rank)
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = server_name(self.replica_rank)


RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: CpuRolloutReplica)
