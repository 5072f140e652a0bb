"""CUDA graphs for decode steps: launch a whole step's kernels with one call.

Why: at small batch a GPU decode step is a few hundred tiny kernels, and the CPU time
to launch them (Python, the dispatcher, the driver) is longer than the GPU time to
run them: the GPU waits. A CUDA graph records the kernels of one step once, with
their buffer addresses, and `replay()` launches them all at once. That is why the
step must have static shapes and static buffers (`static_decode.py`): a graph replays
the same kernels on the same memory, so each step only copies its inputs into the
static tensors before the replay.

As vLLM and nano-vllm do: one graph per bucket size, captured at start-up, largest
first so that the smaller ones reuse its memory pool (one pool shared by all);
each is warmed up on a side stream before its capture (lazy allocations, cuBLAS
handles, Triton's JIT must not happen inside a capture). Attention inside must be
capture-safe: no host sync, no shape that depends on values. The runner captures
only with a backend that says so (`capture_safe = True`, the Triton backend); the
torch reference stays eager on CUDA (its static form reads max_model_len keys per
row, and a capture would hold that memory for the largest bucket).
"""
from __future__ import annotations

import torch

from .fixed_shape_decode import StaticDecodeStep


def capture_safe(backend) -> bool:
    """Does this attention backend's decode run inside a CUDA graph capture? (it declares it)"""
    return backend.capture_safe


class CUDAGraphDecode:
    """`run(seqs) -> logits [len(seqs), V]` by replaying the graph of the batch's bucket.
    `forward(bucket)` is what gets captured: the static step, eager or compiled."""

    def __init__(self, step: StaticDecodeStep, forward=None):
        self.step = step
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}       # each graph's logits buffer
        self.capture_all(forward or step.forward)

    @torch.inference_mode()
    def capture_all(self, forward) -> None:
        self.step.reset_to_padding()            # capture on rows that touch only the scratch block
        pool = torch.cuda.graph_pool_handle()
        for bucket in sorted(self.step.buckets, reverse=True):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    forward(bucket)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bucket] = forward(bucket)
            self.graphs[bucket] = graph
        torch.cuda.synchronize()

    @torch.inference_mode()
    def run(self, seqs) -> torch.Tensor:
        bucket = self.step.prepare(seqs)
        self.graphs[bucket].replay()
        # the buffer is overwritten by the next replay: hand out a copy
        return self.outputs[bucket][:len(seqs)].clone()
