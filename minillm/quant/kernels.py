"""The C kernels of quantized_linear.c (read it), built on first use, plus their weight layouts.

Why our own: torch's packed weight-only CPU matmuls (`aten._weight_int8pack_mm`,
`aten._weight_int4pack_mm_for_cpu`) are vectorized for bfloat16/float16 activations only;
with float32 activations they take a scalar path, 10-25x slower than float32 F.linear at
batch 1 (speed.py's docstring has the figures). These kernels take float32 activations.
No C compiler: `load_kernels()` returns None and the layers use torch's paths.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from ..utils.c_kernels import build

SOURCE = Path(__file__).with_name("quantized_linear.c")
PANEL = 32          # output columns per panel: P in the C file
MAX_ROWS = 64       # above this, dequantize + MKL's GEMM (PanelLinear's cut-off; not tuned here)

load_error = ""


@functools.cache
def load_kernels():
    """The C library with int8_linear and int4_linear typed for ctypes, or None (reason in `load_error`)."""
    global load_error
    lib, load_error = build(SOURCE, ("-mprefer-vector-width=512", "-ffp-contract=fast"))
    if lib is None:
        lib, load_error = build(SOURCE)
    if lib is None:
        return None
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    lib.int8_linear.argtypes = [ptr, i32, i32, ptr, ptr, i32, ptr, i32]
    lib.int4_linear.argtypes = [ptr, i32, i32, ptr, ptr, ptr, i32, i32, ptr, i32]
    lib.int8_linear.restype = lib.int4_linear.restype = None
    return lib


def to_panels(t: torch.Tensor) -> torch.Tensor:
    """[N, X] -> [N / PANEL, X, PANEL]: panel p holds rows p*PANEL.. of t, one column after another."""
    n, x = t.shape
    return t.reshape(n // PANEL, PANEL, x).transpose(1, 2).contiguous()


def pack_int4_panels(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] in 0..15 -> [N / PANEL, K / 2, PANEL]: inputs k and k+1 share a byte, k low."""
    pairs = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return to_panels(pairs)


def int8_matmul(x: torch.Tensor, panels: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x float32 [M, K] contiguous -> [M, N] via int8_linear (a torch op inside torch.compile)."""
    if torch.compiler.is_compiling():
        return torch.ops.minillm.int8_linear(x, panels, scale)
    m, k = x.shape
    n = panels.shape[0] * PANEL
    y = torch.empty(m, n, dtype=torch.float32)
    load_kernels().int8_linear(x.data_ptr(), m, k, panels.data_ptr(), scale.data_ptr(), n, y.data_ptr(),
                               torch.get_num_threads())
    return y


def int4_matmul(x: torch.Tensor, panels: torch.Tensor, scale_panels: torch.Tensor,
                minimum_panels: torch.Tensor, group_size: int) -> torch.Tensor:
    """x float32 [M, K] contiguous -> [M, N] via int4_linear (a torch op inside torch.compile)."""
    if torch.compiler.is_compiling():
        return torch.ops.minillm.int4_linear(x, panels, scale_panels, minimum_panels, group_size)
    m, k = x.shape
    n = panels.shape[0] * PANEL
    y = torch.empty(m, n, dtype=torch.float32)
    load_kernels().int4_linear(x.data_ptr(), m, k, panels.data_ptr(), scale_panels.data_ptr(),
                               minimum_panels.data_ptr(), group_size, n, y.data_ptr(), torch.get_num_threads())
    return y


# The two kernels as torch ops, so a compiled decode step (compiled_decode.py) calls them inside
# its graph instead of breaking it at each ctypes call (as models/cpu_linear.py does for float32).
_OPS = torch.library.Library("minillm", "FRAGMENT")
_OPS.define("int8_linear(Tensor x, Tensor panels, Tensor scale) -> Tensor")
_OPS.define("int4_linear(Tensor x, Tensor panels, Tensor scale_panels, Tensor minimum_panels, int group_size) -> Tensor")
_OPS.impl("int8_linear", int8_matmul, "CPU")
_OPS.impl("int4_linear", int4_matmul, "CPU")


@torch.library.register_fake("minillm::int8_linear")
def _(x, panels, scale):
    return x.new_empty(x.shape[0], panels.shape[0] * PANEL)


@torch.library.register_fake("minillm::int4_linear")
def _(x, panels, scale_panels, minimum_panels, group_size):
    return x.new_empty(x.shape[0], panels.shape[0] * PANEL)
