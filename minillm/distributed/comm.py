"""The ranks' process group and the two collectives a sharded forward needs, each timed.

torch.distributed does the work: `gloo` on CPU (processes on one machine all-reduce over
loopback TCP), `nccl` on CUDA (one GPU per rank). Every collective has a timeout (the group's),
so a rank that died makes its peers raise within seconds instead of waiting forever.

The counters (`seconds`, `bytes`, `calls`) are what `bench tp` reports as communication: the time
a rank spends inside collectives and the bytes it hands them, against the formula (per token and
layer, two all-reduces of hidden_size values).
"""
from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist


class TensorParallelGroup:
    def __init__(self, rank: int, world_size: int, port: int, device: torch.device, timeout_s: float = 30.0):
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s))
        self.rank, self.world_size, self.device = rank, world_size, device
        self.seconds, self.bytes, self.calls = 0.0, 0, 0

    def _timed(self, tensor: torch.Tensor, start: float) -> None:
        self.seconds += time.perf_counter() - start
        self.bytes += tensor.numel() * tensor.element_size()
        self.calls += 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's x, on every rank (in place)."""
        start = time.perf_counter()
        dist.all_reduce(x)
        self._timed(x, start)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x, side by side along the last dimension, on every rank."""
        start = time.perf_counter()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous())
        self._timed(x, start)
        return torch.cat(parts, dim=-1)

    def counters(self) -> dict:
        return {"comm_seconds": self.seconds, "comm_bytes": self.bytes, "comm_calls": self.calls}

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
