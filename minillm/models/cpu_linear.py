"""Decode-sized matmuls on CPU with weights packed once: `PanelLinear`.

Why: a decode step multiplies a few dozen rows by every weight. MKL repacks the
weight on every such call; at 40 rows that costs about a third of the time on the
large matrices (measured in the loaded SmolLM2, 2 cores, 40 rows, all layers:
gate+up 64 -> 46 ms, down 28 -> 22 ms, output head 34 -> 20 ms). Read the C file
next to this one.

`PanelLinear` holds an nn.Linear's own weight and bias (same state dict) plus a second,
packed copy of the weight, used when the batch is small, float32 and on the CPU; anything
else (prefill chunks, CUDA, other dtypes, no C compiler) goes to F.linear. Writing to the
weight (load_state_dict, an in-place edit) repacks the copy on the next call. The kernel is
called as `torch.ops.minillm.panel_linear`, whose CPU kernel is C++ once built (utils/native_ops.py:
a cheaper call, 4.9 vs 10.8 us on a tiny layer, quant/speed.py), by ctypes where it is not.

The panel layout (`PANEL`, `to_panels`) is also the one of quant/'s int8, int4 and w4a8 kernels.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..utils.c_kernels import INT, MATMUL_FLAGS, PTR, CKernel, define_op

PANEL = 32          # output columns per panel: P in the C file (and in quant/'s kernels)
MAX_ROWS = 64       # above this MKL's blocked GEMM is as fast (layer shapes, 128 rows: 158 vs 157 GFLOP/s)
MIN_WEIGHTS = 1 << 19   # smaller weights stay with MKL: at 40 rows it was faster on SmolLM2's
                        # 576x576 and 192x576 projections, slower on 1536x576, 576x1536 and the head

KERNEL = CKernel(Path(__file__).with_name("small_batch_linear.c"),
                 {"small_batch_linear": ([PTR, INT, INT, PTR, INT, PTR, INT], None)}, MATMUL_FLAGS)
__getattr__ = KERNEL.module_getattr(__name__)     # cpu_linear.load_error: why it did not build


def load_kernel():
    """The compiled kernel as a ctypes function, or None (with the reason in `load_error`)."""
    return KERNEL.function("small_batch_linear")


def to_panels(t: torch.Tensor) -> torch.Tensor:
    """[N, X] -> [N / PANEL, X, PANEL]: panel p holds rows p*PANEL.. of t (output columns
    p*PANEL.. of a weight), one input after another. The layout of every linear C kernel here."""
    n, x = t.shape
    return t.detach().reshape(n // PANEL, PANEL, x).transpose(1, 2).contiguous()


def panel_output(x: torch.Tensor, panels: torch.Tensor, *weights) -> torch.Tensor:
    """An empty [M, N] output of x times weights in panels: the fake of every panel-matmul op."""
    return x.new_empty(x.shape[0], panels.shape[0] * PANEL)


class PanelLinear(nn.Module):
    """An nn.Linear's weight and bias (the same Parameters: state dict and weight tying are
    unchanged) plus a packed copy of the weight for small batches."""

    def __init__(self, linear: nn.Linear, kernel):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.register_parameter("bias", linear.bias)
        self.register_buffer("panels", to_panels(linear.weight), persistent=False)
        self.packed_from = self._weight_identity()
        self.kernel = kernel

    def _weight_identity(self) -> tuple[int, int]:
        """Changes whenever the weight's values may have: an in-place write bumps _version
        (a weight made under inference_mode has no version counter; then only its storage counts)."""
        try:
            version = self.weight._version
        except RuntimeError:
            version = -1
        return version, self.weight.data_ptr()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        small = (x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype == torch.float32
                 and x.device.type == "cpu" and self.panels.device.type == "cpu")
        if not small:
            return F.linear(x, self.weight, self.bias)
        compiling = torch.compiler.is_compiling()       # (weights are fixed while serving compiled)
        if not compiling and self._weight_identity() != self.packed_from:
            self.panels = to_panels(self.weight)
            self.packed_from = self._weight_identity()
        if compiling or KERNEL.native:
            y = torch.ops.minillm.panel_linear(x, self.panels)     # one graph node; eager: the C++ op
        else:
            y = run_kernel(self.kernel, x, self.panels)             # ctypes (no C++ compiler)
        return y if self.bias is None else y + self.bias


def run_kernel(kernel, x: torch.Tensor, panels: torch.Tensor) -> torch.Tensor:
    """y = x W^T with W packed in panels [N / PANEL, K, PANEL], by `kernel` (the ctypes function):
    the op's fallback where its C++ wrapper is not built."""
    x = x.contiguous()
    y = torch.empty(x.shape[0], panels.shape[0] * PANEL, dtype=x.dtype)
    kernel(x.data_ptr(), x.shape[0], x.shape[1], panels.data_ptr(), y.shape[1], y.data_ptr(),
           torch.get_num_threads())
    return y


# A torch op, so a compiled decode step (compiled_decode.py) keeps the kernel in its graph; its CPU
# kernel is torch_ops.cpp's wrapper once KERNEL loads (utils/native_ops.py), else run_kernel.
define_op("panel_linear(Tensor x, Tensor panels) -> Tensor",
          lambda x, panels: run_kernel(load_kernel(), x, panels), panel_output, KERNEL, "small_batch_linear")


def use_panel_linears(model: nn.Module) -> int:
    """Replace every large float32 CPU nn.Linear whose width is a multiple of PANEL by a
    PanelLinear, in place. Returns how many were replaced (0 without a C compiler)."""
    kernel = load_kernel()
    if kernel is None:
        return 0
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (type(child) is nn.Linear and child.out_features % PANEL == 0
                    and child.weight.numel() >= MIN_WEIGHTS
                    and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu"):
                setattr(parent, name, PanelLinear(child, kernel))
                count += 1
    return count
