"""verl's platform hook for a machine without an accelerator: device "cpu", collectives on gloo.

Why it exists: verl 0.9.1 resolves its device once per process through
`verl.plugin.platform.get_platform()` (`VERL_PLATFORM` picks a registered name). Only NVIDIA,
Ascend and ROCm are registered, and without a GPU verl falls back to "nvidia" and fails on the
first `torch.cuda` call. `PlatformCPU` is registered as "cpu" by `parser.train.cpu` (see
there for how every Ray process loads it).

What a CPU is *not*: it has no device memory, streams that matter, IPC or NCCL. The
`torch.<device>` module verl asks for is `CPU_DEVICE`: `torch.cpu` plus the few memory/RNG
calls verl makes on every device (`empty_cache`, `mem_get_info`, `get_rng_state`, ...), which
here report host memory or do nothing.

Ray resources: verl sizes its placement groups in "GPU" bundles and checks the cluster's
"GPU" count, so a CPU run declares logical GPUs to Ray (`ray_init.num_gpus`, one per verl
process that would hold a GPU); nothing ever uses them as devices.
"""
from __future__ import annotations

import contextlib
import os
import types
from typing import Any, Optional

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

PLATFORM_NAME = "cpu"


def _host_memory() -> tuple[int, int]:
    pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    available = os.sysconf("SC_AVPHYS_PAGES")
    return available * page_size, pages * page_size


def _nothing(*_: Any, **__: Any) -> None:
    return None


def _zero(*_: Any, **__: Any) -> int:
    return 0


class _CpuDeviceModule(types.ModuleType):
    """`torch.cpu` with the accelerator-module calls verl makes on any device."""

    def __init__(self) -> None:
        super().__init__("parser.train.cpu.device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    empty_cache = staticmethod(_nothing)
    ipc_collect = staticmethod(_nothing)
    set_per_process_memory_fraction = staticmethod(_nothing)
    reset_peak_memory_stats = staticmethod(_nothing)
    memory_allocated = staticmethod(_zero)
    memory_reserved = staticmethod(_zero)
    max_memory_allocated = staticmethod(_zero)
    max_memory_reserved = staticmethod(_zero)
    mem_get_info = staticmethod(lambda *_: _host_memory())
    get_rng_state = staticmethod(lambda *_: torch.get_rng_state())
    set_rng_state = staticmethod(lambda state, *_: torch.set_rng_state(state))
    manual_seed = staticmethod(torch.manual_seed)
    manual_seed_all = staticmethod(torch.manual_seed)
    # verl's FLOPs counter looks the device name up in its table of GPUs (unknown -> no MFU)
    get_device_name = staticmethod(lambda *_: "CPU")


CPU_DEVICE = _CpuDeviceModule()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """CPU-only verl processes: torch "cpu" tensors, gloo collectives, logical Ray GPUs."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return CPU_DEVICE

    def is_available(self) -> bool:
        return True

    def current_device(self) -> str:
        # verl uses it as a device spec (`tensor.to(get_device_id())`); an int would mean cuda:N.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for the logical GPUs; nothing on a CPU reads it.
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
