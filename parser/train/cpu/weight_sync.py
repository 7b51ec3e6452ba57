"""A verl checkpoint engine that syncs weights trainer -> rollout over gloo, on CPUs.

Why it exists: in `separate_async` mode the trainer pushes its weights to the standalone
rollout replicas after every step through a `CheckpointEngine` (verl 0.9.1
`verl/checkpoint_engine/base.py`). The built-in engines move GPU buffers (nccl needs cupy,
hccl an NPU, nixl/mooncake RDMA); the `naive` one is only for a colocated rollout and
separate_async refuses it. This is the same protocol on gloo: registered as backend
`cpu_gloo` in verl's `CheckpointEngineRegistry`, it runs in the trainer's workers and in the
rollout replicas' `CheckpointEngineWorker`s exactly where NCCL would.

    actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_gloo

Topology per sync (`build_topology`): trainer rank 0 is the broadcast root (rank 0 of a
fresh gloo group), each rollout worker joins as ranks 1..N; the other trainer ranks only
drain their weight generator (FSDP's all-gathers need every rank). Wire format: buckets of
at most `update_weights_bucket_megabytes` (one tensor alone if larger), each a pickled
header of (name, shape, dtype, offset, nbytes) and one uint8 buffer; an empty header ends.
"""
from __future__ import annotations

import datetime
import pickle
import socket
from typing import Any, AsyncGenerator, Generator

import torch
import torch.distributed as dist
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

BACKEND = "cpu_gloo"
TIMEOUT = datetime.timedelta(minutes=10)


def _host_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@CheckpointEngineRegistry.register(BACKEND)
class GlooCheckpointEngine(CheckpointEngine):
    def __init__(self, bucket_size: int, is_master: bool = False, **_: Any) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.store: dist.TCPStore | None = None
        self.group: dist.ProcessGroupGloo | None = None

    # ------------------------------------------------------------------ topology
    def prepare(self) -> dict[str, Any]:
        if not self.is_master:
            return {}
        host = _host_ip()
        self.store = dist.TCPStore(host, 0, None, True, timeout=TIMEOUT, wait_for_workers=False)
        return {"host": host, "port": self.store.port}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        world_size = 1 + rollout_world_size
        master = metadata[0]
        actor = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),
            "world_size": [world_size] * actor_wg_world_size,
            "master_metadata": [master] * actor_wg_world_size,
        }
        rollout = {
            "rank": list(range(1, world_size)),
            "world_size": [world_size] * rollout_world_size,
            "master_metadata": [master] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, rank: int, world_size: int, master_metadata: dict[str, Any]) -> None:
        if rank < 0:
            return
        if self.store is None:
            self.store = dist.TCPStore(master_metadata["host"], master_metadata["port"], None, False, timeout=TIMEOUT)
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("parser_weight_sync", self.store), rank, world_size, TIMEOUT)

    def finalize(self) -> None:
        self.group = None
        self.store = None

    # ------------------------------------------------------------------ transfer
    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()

    def _broadcast_header(self, header: Any = None) -> Any:
        payload = pickle.dumps(header) if header is not None else b""
        length = torch.tensor([len(payload)], dtype=torch.int64)
        self._broadcast(length)
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if header is not None else None
        if data is None:
            data = torch.empty(int(length.item()), dtype=torch.uint8)
        if int(length.item()):
            self._broadcast(data)
            return pickle.loads(data.numpy().tobytes())
        return None

    def _send_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        metas, offset = [], 0
        for name, tensor in bucket:
            metas.append((name, tuple(tensor.shape), tensor.dtype, offset, tensor.nbytes))
            offset += tensor.nbytes
        buffer = torch.empty(offset, dtype=torch.uint8)
        for (_, _, _, start, nbytes), (_, tensor) in zip(metas, bucket, strict=True):
            buffer[start : start + nbytes] = tensor.reshape(-1).view(torch.uint8)
        self._broadcast_header({"metas": metas, "size": offset})
        self._broadcast(buffer)

    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps: int | None = None):
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        async for name, tensor in ensure_async_iterator(weights):
            if self.group is None:  # not the root: drain (FSDP gathers are collective)
                continue
            tensor = tensor.detach().to("cpu").contiguous()
            if bucket and size + tensor.nbytes > self.bucket_size:
                self._send_bucket(bucket)
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += tensor.nbytes
        if self.group is None:
            return {}
        if bucket:
            self._send_bucket(bucket)
        self._broadcast_header(None)
        return {}

    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        while True:
            header = self._broadcast_header(None)
            if header is None:
                return
            buffer = torch.empty(header["size"], dtype=torch.uint8)
            self._broadcast(buffer)
            for name, shape, dtype, start, nbytes in header["metas"]:
                yield name, buffer[start : start + nbytes].view(dtype).reshape(shape)
