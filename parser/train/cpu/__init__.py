"""verl 0.9.1's real trainer on a machine without a GPU: CI and laptops, not a second trainer.

Every piece is one of verl's extension points; no verl file is copied or edited. Loaded into
every verl process (driver, TaskRunner, trainer workers, rollout replicas, reward workers)
by verl's own `VERL_USE_EXTERNAL_MODULES=parser.train.cpu` (read when `verl` is imported), with
`VERL_PLATFORM=cpu` selecting the platform; `parser.train` sets both, in the launching
process and in Ray's runtime env, when the config says `trainer.device: cpu`.

| what a GPU run has | on the CPU | verl extension point |
|---|---|---|
| CUDA platform (nccl) | `platform.PlatformCPU` (gloo, host memory) | `PlatformRegistry` + `VERL_PLATFORM` |
| FSDP engine for cuda/npu | verl's own FSDP2 engine (`FSDP2OnCPU`: no pinned offload), registered for "cpu" | `EngineRegistry.register` |
| SGLang rollout server | `rollout.CpuRolloutReplica` (transformers, TP 1) | `RolloutReplicaRegistry` (`rollout.name=parser_cpu`) |
| nccl weight sync | `weight_sync.GlooCheckpointEngine` | `CheckpointEngineRegistry` (`checkpoint_engine.backend=cpu_gloo`) |
| GPUs in Ray | logical GPUs (`ray_init.num_gpus`) | `ray_kwargs.ray_init` |
| π_old kept in host memory (Decoupled PPO) | a real copy of each shard (`_snapshot_copies_on_cpu`) | `verl.utils.fsdp_utils` save helper |

Config-only differences (configs/train/cpu_smoke.yaml): sdpa attention (flash-attention-2 is
GPU-only), `fsdp2` strategy (FSDP1 needs a GPU), rollout tensor parallel 1, TransferQueue
with 1 storage unit (each unit holds a whole Ray CPU; 8 of them starve a 2-core machine).

The one change below verl: verl builds its process-group backend as
`f"cpu:gloo,{device}:{backend}"` (verl/utils/distributed.py, `initialize_global_process_group_ray`),
which on a CPU is "cpu:gloo,cpu:gloo", and torch rejects a repeated device. `_accept_repeated_cpu_gloo`
wraps `torch.distributed.init_process_group` to drop an exact repeat of a device:backend pair
(nothing else changes), only in processes that loaded this module.

And one below verl's separate_async trainer: with `parameter_sync_step > 1` it keeps the weights
of the last sync (π_old) with `fsdp2_sharded_save_to_cpu`, which "moves" each shard to the CPU
with `.cpu()` — on a CPU that returns the shard itself, not a copy, so the optimizer step then
updates the kept π_old too and every later mini-batch of the cycle computed its old log-probs
with the new weights (measured: step 1 of train/cpu_smoke, second mini-batch, the answer token's
log-prob 0.44 off the rollout's at equal weights). `_snapshot_copies_on_cpu` wraps the helper to
clone a shard that came back as the live tensor; on a GPU nothing changes.
"""
from __future__ import annotations

import functools

import torch.distributed

# The platform first: importing verl's engines asks for the device at import time.
from parser.train.cpu import platform  # noqa: I001  (registers "cpu")
from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

from parser.train.cpu import rollout, weight_sync  # noqa: F401  (registrations)

PLATFORM = platform.PLATFORM_NAME
ROLLOUT = rollout.ROLLOUT_NAME
WEIGHT_SYNC = weight_sync.BACKEND
ENV = {"VERL_PLATFORM": PLATFORM, "VERL_USE_EXTERNAL_MODULES": __name__}


def _dedupe_backend(backend: str | None) -> str | None:
    if not backend or "," not in backend:
        return backend
    pairs = list(dict.fromkeys(p.strip() for p in backend.split(",")))
    return ",".join(pairs)


def _accept_repeated_cpu_gloo() -> None:
    init = torch.distributed.init_process_group
    if getattr(init, "_parser_cpu", False):
        return

    @functools.wraps(init)
    def init_process_group(backend=None, *args, **kwargs):
        return init(_dedupe_backend(backend), *args, **kwargs)

    init_process_group._parser_cpu = True
    torch.distributed.init_process_group = init_process_group


def _snapshot_copies_on_cpu() -> None:
    from verl.utils import fsdp_utils

    save = fsdp_utils.fsdp2_sharded_save_to_cpu
    if getattr(save, "_parser_cpu", False):
        return

    @functools.wraps(save)
    def fsdp2_sharded_save_to_cpu(model):
        state, spec = save(model)
        live = {name: (p._local_tensor if hasattr(p, "_local_tensor") else p) for name, p in model.named_parameters()}
        for name, (tensor, shard_spec) in state.items():
            if name in live and tensor.untyped_storage().data_ptr() == live[name].untyped_storage().data_ptr():
                state[name] = (tensor.clone(), shard_spec)
        return state, spec

    fsdp2_sharded_save_to_cpu._parser_cpu = True
    fsdp_utils.fsdp2_sharded_save_to_cpu = fsdp2_sharded_save_to_cpu


class FSDP2OnCPU(FSDPEngineWithLMHead):
    """verl's FSDP2 engine, without the CPU-offload policy it forces on forward-only models
    (the reference): that policy pins host memory, which needs an accelerator, and offloading
    to the CPU means nothing when everything is already there. `forward_only` is read in
    `_build_fsdp_module` only to choose that policy, so it is lifted for that call alone."""

    def _build_fsdp_module(self, module):
        forward_only = self.engine_config.forward_only
        self.engine_config.forward_only = False
        try:
            return super()._build_fsdp_module(module)
        finally:
            self.engine_config.forward_only = forward_only


def _register_fsdp_on_cpu() -> None:
    engines = EngineRegistry._engines.get("language_model", {}).get("fsdp2", {})
    if PLATFORM not in engines:
        EngineRegistry.register(model_type="language_model", backend="fsdp2", device=PLATFORM)(FSDP2OnCPU)


_accept_repeated_cpu_gloo()
_snapshot_copies_on_cpu()
_register_fsdp_on_cpu()
