"""Lesson 06: swap space. KV blocks in CPU memory for preempted sequences.

When the device pool runs dry, a preempted sequence can keep its KV instead of
recomputing it later: its blocks are copied to CPU blocks and the device blocks
are freed. Resuming copies them back into fresh device blocks. Swapping trades
copy bandwidth for the FLOPs that recomputation would cost; lesson 06 measures both.

Bookkeeping (which CPU block holds what) is a second `BlockAllocator` in the block
manager; this file only holds the CPU tensors and moves bytes. Copies are queued
as (src, dst) pairs and done by the engine before the next forward.

On CUDA the CPU blocks are pinned (page-locked), so the GPU's copy engine can DMA
them without a staging copy and without stopping the host, and every copy runs on
a stream of its own (as vLLM's swap does, one cudaMemcpyAsync per run of blocks).
Two orderings keep it correct, both made with `wait_stream` (an event on the GPU,
no host wait):
  - the copy stream waits for the compute stream before it starts: a copy-out must
    read what the last forward wrote, and a copy-in must not land before earlier work;
  - the compute stream waits for the copy stream afterwards: the device blocks a
    copy-out reads are free from now on and the next forward may write into them,
    and that forward reads what the copy-ins bring.
"""
from __future__ import annotations

import torch


def contiguous_runs(pairs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(src, dst) block pairs -> (src start, dst start, length) runs where both sides are
    consecutive: one copy per run instead of one per block."""
    runs: list[list[int]] = []
    for src, dst in pairs:
        if runs and src == runs[-1][0] + runs[-1][2] and dst == runs[-1][1] + runs[-1][2]:
            runs[-1][2] += 1
        else:
            runs.append([src, dst, 1])
    return [tuple(r) for r in runs]


class SwapSpace:
    def __init__(self, num_blocks: int, device_layers: list[torch.Tensor]):
        """`device_layers`: the device cache's per-layer tensors [blocks, block_size, Hkv, D]."""
        on_cuda = device_layers[0].is_cuda
        self.layers = [torch.zeros((num_blocks, *t.shape[1:]), dtype=t.dtype, device="cpu",
                                   pin_memory=on_cuda) for t in device_layers]
        self.copy_stream = torch.cuda.Stream(device_layers[0].device) if on_cuda else None
        self.bytes_moved = 0

    def copy_out(self, device_layers: list[torch.Tensor], pairs: list[tuple[int, int]]) -> None:
        """Device block src -> CPU block dst, in every layer."""
        if not pairs:
            return
        if self.copy_stream is not None:
            self._copy_async(device_layers, self.layers, pairs)
            return
        src, dst = torch.tensor([s for s, _ in pairs]), torch.tensor([d for _, d in pairs])
        for dev, cpu in zip(device_layers, self.layers):
            cpu[dst] = dev[src]
            self.bytes_moved += cpu[dst].numel() * cpu.element_size()

    def copy_in(self, device_layers: list[torch.Tensor], pairs: list[tuple[int, int]]) -> None:
        """CPU block src -> device block dst, in every layer."""
        if not pairs:
            return
        if self.copy_stream is not None:
            self._copy_async(self.layers, device_layers, pairs)
            return
        src, dst = torch.tensor([s for s, _ in pairs]), torch.tensor([d for _, d in pairs])
        for dev, cpu in zip(device_layers, self.layers):
            dev[dst] = cpu[src]
            self.bytes_moved += cpu[src].numel() * cpu.element_size()

    def _copy_async(self, sources: list[torch.Tensor], targets: list[torch.Tensor],
                    pairs: list[tuple[int, int]]) -> None:
        """Block copies between device and pinned memory on the copy stream, ordered
        against the compute stream both ways (see the module doc)."""
        compute = torch.cuda.current_stream(self.copy_stream.device)
        self.copy_stream.wait_stream(compute)
        with torch.cuda.stream(self.copy_stream):
            for source, target in zip(sources, targets):
                for src, dst, n in contiguous_runs(pairs):
                    target[dst:dst + n].copy_(source[src:src + n], non_blocking=True)
                self.bytes_moved += len(pairs) * source[0].numel() * source.element_size()
        compute.wait_stream(self.copy_stream)

    def synchronize(self) -> None:
        """Wait (on the host) until every queued copy is done: before reading the CPU blocks."""
        if self.copy_stream is not None:
            self.copy_stream.synchronize()
