"""The C kernels of quantized_linear.c (read it), built on first use, plus their weight layouts.

Why our own: torch's packed weight-only CPU matmuls (`aten._weight_int8pack_mm`,
`aten._weight_int4pack_mm_for_cpu`) are vectorized for bfloat16/float16 activations only;
with float32 activations they take a scalar path, 10-25x slower than float32 F.linear at
batch 1 (speed.py's docstring has the figures). These kernels take float32 activations.
No C compiler: `load_kernels()` returns None and the layers use torch's paths. The kernels are
called as torch ops whose CPU kernel is C++ (utils/native_ops.py), by ctypes where that is not built.

The weights are laid out in PanelLinear's panels (models/cpu_linear.py: `PANEL`, `to_panels`).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..models.cpu_linear import PANEL, panel_output, to_panels
from ..models.cpu_linear import MAX_ROWS  # noqa: F401  int8/int4.py: above it, dequantize + MKL's GEMM (not tuned here)
from ..utils.c_kernels import INT, MATMUL_FLAGS, PTR, CKernel, define_op

KERNEL = CKernel(Path(__file__).with_name("quantized_linear.c"), {
    "int8_linear": ([PTR, INT, INT, PTR, PTR, INT, PTR, INT], None),
    "int4_linear": ([PTR, INT, INT, PTR, PTR, PTR, INT, INT, PTR, INT], None),
}, MATMUL_FLAGS)
load_kernels = KERNEL.load        # the library (int8_linear, int4_linear) or None
__getattr__ = KERNEL.module_getattr(__name__)     # kernels.load_error: why it did not build


def pack_int4_panels(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] in 0..15 -> [N / PANEL, K / 2, PANEL]: inputs k and k+1 share a byte, k low."""
    pairs = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return to_panels(pairs)


def int8_matmul(x: torch.Tensor, panels: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x float32 [M, K] contiguous -> [M, N] via int8_linear: the C++ op where it is built (and
    while compiling), else ctypes (`int8_ctypes`). The op is the cheaper call: 4.5 vs 8.1 us at
    batch 1 on a tiny layer (speed.py --per-call, rough)."""
    if KERNEL.native or torch.compiler.is_compiling():
        return torch.ops.minillm.int8_linear(x, panels, scale)
    return int8_ctypes(x, panels, scale)


def int4_matmul(x: torch.Tensor, panels: torch.Tensor, scale_panels: torch.Tensor,
                minimum_panels: torch.Tensor, group_size: int) -> torch.Tensor:
    """x float32 [M, K] contiguous -> [M, N] via int4_linear: the C++ op, else ctypes (`int4_ctypes`)."""
    if KERNEL.native or torch.compiler.is_compiling():
        return torch.ops.minillm.int4_linear(x, panels, scale_panels, minimum_panels, group_size)
    return int4_ctypes(x, panels, scale_panels, minimum_panels, group_size)


def int8_ctypes(x: torch.Tensor, panels: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8_linear called with ctypes: the op's Python fallback where its C++ wrapper is not built."""
    m, k = x.shape
    n = panels.shape[0] * PANEL
    y = torch.empty(m, n, dtype=torch.float32)
    load_kernels().int8_linear(x.data_ptr(), m, k, panels.data_ptr(), scale.data_ptr(), n, y.data_ptr(),
                               torch.get_num_threads())
    return y


def int4_ctypes(x: torch.Tensor, panels: torch.Tensor, scale_panels: torch.Tensor,
                minimum_panels: torch.Tensor, group_size: int) -> torch.Tensor:
    """int4_linear called with ctypes (the fallback, as int8_ctypes)."""
    m, k = x.shape
    n = panels.shape[0] * PANEL
    y = torch.empty(m, n, dtype=torch.float32)
    load_kernels().int4_linear(x.data_ptr(), m, k, panels.data_ptr(), scale_panels.data_ptr(),
                               minimum_panels.data_ptr(), group_size, n, y.data_ptr(), torch.get_num_threads())
    return y


# The two kernels as torch ops, so a compiled decode step (compiled_decode.py) keeps them in its graph;
# their CPU kernels are torch_ops.cpp's wrappers once KERNEL loads (utils/native_ops.py).
define_op("int8_linear(Tensor x, Tensor panels, Tensor scale) -> Tensor", int8_ctypes, panel_output,
          KERNEL, "int8_linear")
define_op("int4_linear(Tensor x, Tensor panels, Tensor scale_panels, Tensor minimum_panels, int group_size) "
          "-> Tensor", int4_ctypes, panel_output, KERNEL, "int4_linear")
