"""Lesson 06: swap space. KV blocks in CPU memory for preempted sequences.

When the device pool runs dry, a preempted sequence can keep its KV instead of
recomputing it later: its blocks are copied to CPU blocks and the device blocks
are freed. Resuming copies them back into fresh device blocks. Swapping trades
copy bandwidth for the FLOPs that recomputation would cost; lesson 06 measures both.

Bookkeeping (which CPU block holds what) is a second `BlockAllocator` in the block
manager; this file only holds the CPU tensors and moves bytes. Copies are queued
as (src, dst) pairs and done by the engine before the next forward.
"""
from __future__ import annotations

import torch


class SwapSpace:
    def __init__(self, num_blocks: int, device_layers: list[torch.Tensor]):
        """`device_layers`: the device cache's per-layer tensors [blocks, block_size, Hkv, D]."""
        pin = device_layers[0].is_cuda and torch.cuda.is_available()
        self.layers = [torch.zeros((num_blocks, *t.shape[1:]), dtype=t.dtype, device="cpu",
                                   pin_memory=pin) for t in device_layers]
        self.bytes_moved = 0

    def copy_out(self, device_layers: list[torch.Tensor], pairs: list[tuple[int, int]]) -> None:
        """Device block src -> CPU block dst, in every layer."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=device_layers[0].device)
        dst = torch.tensor([d for _, d in pairs])
        for dev, cpu in zip(device_layers, self.layers):
            cpu[dst] = dev[src].to("cpu")
            self.bytes_moved += cpu[dst].numel() * cpu.element_size()

    def copy_in(self, device_layers: list[torch.Tensor], pairs: list[tuple[int, int]]) -> None:
        """CPU block src -> device block dst, in every layer."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs])
        dst = torch.tensor([d for _, d in pairs], device=device_layers[0].device)
        for dev, cpu in zip(device_layers, self.layers):
            dev[dst] = cpu[src].to(dev.device)
            self.bytes_moved += cpu[src].numel() * cpu.element_size()
