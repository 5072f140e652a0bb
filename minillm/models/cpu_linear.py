"""Decode-sized matmuls on CPU with weights packed once: `PanelLinear`.

Why: a decode step multiplies a few dozen rows by every weight. MKL repacks the
weight on every such call; at 40 rows that costs about a third of the time on the
large matrices (measured in the loaded SmolLM2, 2 cores, 40 rows, all layers:
gate+up 64 -> 46 ms, down 28 -> 22 ms, output head 34 -> 20 ms). Read the C file
next to this one.

`PanelLinear` holds an nn.Linear's own weight and bias (same state dict) plus a second,
packed copy of the weight, used when the batch is small, float32 and on the CPU; anything
else (prefill chunks, CUDA, other dtypes, no C compiler) goes to F.linear. Writing to the
weight (load_state_dict, an in-place edit) repacks the copy on the next call.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..utils.c_kernels import build

SOURCE = Path(__file__).with_name("small_batch_linear.c")
PANEL = 32          # output columns per panel: P in the C file
MAX_ROWS = 64       # above this MKL's blocked GEMM is as fast (layer shapes, 128 rows: 158 vs 157 GFLOP/s)
MIN_WEIGHTS = 1 << 19   # smaller weights stay with MKL: at 40 rows it was faster on SmolLM2's
                        # 576x576 and 192x576 projections, slower on 1536x576, 576x1536 and the head


@functools.cache
def load_kernel():
    """The compiled kernel as a ctypes function, or None (with the reason in `load_error`)."""
    global load_error
    lib, load_error = build(SOURCE, ("-mprefer-vector-width=512", "-ffp-contract=fast"))
    if lib is None:
        lib, load_error = build(SOURCE)       # a compiler that does not know the flag
    if lib is None:
        return None
    fn = lib.small_batch_linear
    P, I = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [P, I, I, P, I, P, I]
    fn.restype = None
    return fn


load_error = ""


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [N / PANEL, K, PANEL]: panel p holds output columns p*PANEL.. for every input k."""
    n, k = weight.shape
    return weight.detach().reshape(n // PANEL, PANEL, k).transpose(1, 2).contiguous()


class PanelLinear(nn.Module):
    """An nn.Linear's weight and bias (the same Parameters: state dict and weight tying are
    unchanged) plus a packed copy of the weight for small batches."""

    def __init__(self, linear: nn.Linear, kernel):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.register_parameter("bias", linear.bias)
        self.register_buffer("panels", pack_panels(linear.weight), persistent=False)
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
        if torch.compiler.is_compiling():     # a compiled decode step: the kernel as one graph node
            y = torch.ops.minillm.panel_linear(x, self.panels)   # (weights are fixed while serving)
        else:
            if self._weight_identity() != self.packed_from:
                self.panels = pack_panels(self.weight)
                self.packed_from = self._weight_identity()
            y = run_kernel(self.kernel, x, self.panels)
        return y if self.bias is None else y + self.bias


def run_kernel(kernel, x: torch.Tensor, panels: torch.Tensor) -> torch.Tensor:
    """y = x W^T with W packed in panels [N / PANEL, K, PANEL]."""
    x = x.contiguous()
    y = torch.empty(x.shape[0], panels.shape[0] * PANEL, dtype=x.dtype)
    kernel(x.data_ptr(), x.shape[0], x.shape[1], panels.data_ptr(), y.shape[1], y.data_ptr(),
           torch.get_num_threads())
    return y


# The packed small-batch matmul as a torch op, so torch.compile (compiled_decode.py) calls it
# inside its graph instead of breaking the graph at each ctypes call. Defined with
# torch.library.Library, not @custom_op: the latter's dispatch costs ~40 us a call, ~10x more.
_OPS = torch.library.Library("minillm", "FRAGMENT")
_OPS.define("panel_linear(Tensor x, Tensor panels) -> Tensor")
_OPS.impl("panel_linear", lambda x, panels: run_kernel(load_kernel(), x, panels), "CPU")


@torch.library.register_fake("minillm::panel_linear")
def _(x, panels):
    """What the compiler needs to know of the op: the output's shape and dtype."""
    return x.new_empty(x.shape[0], panels.shape[0] * PANEL)


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
