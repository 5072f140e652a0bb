"""`W4A8Linear` ("w4a8"): int4 weights (int4.py's scheme) times activations rounded to int8.

Weight-only int4 keeps the activations in float, so its kernel converts every code to float
before multiplying: that arithmetic, not the bytes read, sets the kernel's time (below: from a
few rows up, or on one thread; at one row on two threads per-call overhead hides it). llama.cpp's
4-bit CPU path rounds the activations to int8 too (blocks of 32, one scale each) and multiplies
integers; this backend does the same (w4a8_linear.c: AVX-512 VNNI, 64 byte products per
instruction). The price is the activations' rounding: quality.py measures it against int4.

Which matmul runs: float32 on CPU: the C kernel, at every number of rows (when it is built and
out_features is a multiple of 32, as in every model here); anything else (bfloat16/float16,
CUDA, no C compiler): the reference, F.linear(fake-quantized x, dequantized W), which is not
batch-invariant (see below).

Why the kernel at every size (the weight-only backends switch to dequantize + F.linear above
64 rows): rounding the activations makes the layer jump where weight-only layers move smoothly.
A float-rounding difference upstream can push one activation across a rounding boundary and
change the output by d * |w|, not by float noise. So a row must be computed the same way
whatever else shares the step, or a request's tokens would depend on its batch (and the
engine's one-at-a-time re-run after a fault would not reproduce them). The same jumps make the
engine's greedy tokens differ from a no-cache forward's (different attention arithmetic) at
larger logit gaps than weight-only schemes do: the first differences measured were at gaps of
0.15-0.17 (tests/test_quantization.py allows 0.5 for this scheme, 1e-3 for the others).
llama.cpp, which rounds its activations the same way, has the same property.

Measured (`python -m minillm.quant.speed --threads T --methods int4-g32 w4a8`, quiet 2-core
AMD EPYC with AVX-512 VNNI; 210 distinct layers of SmolLM2-135M's shapes, ms per step):
    rows                     1       8      32
    int4-g32, 1 thread     16.0    78.9   204.7
    w4a8,     1 thread     13.2    18.0    46.2      (4.4x at 8 rows, 4.4x at 32)
    int4-g32, 2 threads     7.3    22.9    78.4
    w4a8,     2 threads     7.7    15.1    37.3
At one row and two threads both are bound by what is not arithmetic: ~18 us per call of
overhead (Python, the op dispatcher, ctypes, OpenMP's fork) times 210 calls, and DRAM. torch's
own int4 CPU op takes a scalar path with float32 activations (speed.py: 5.3 ms for ONE layer).
Since these figures the op's CPU kernel is C++ (utils/native_ops.py): a tiny call costs 7.1 us
instead of 11.2 by ctypes (speed.py --per-call, rough). And the scales and minimums are float16
(int4.py): 4 bytes per group of 32 instead of 8, 0.625 bytes a weight instead of 0.75, and the
kernel asks for its codes 2 KB ahead (__builtin_prefetch, as quantized_linear.c: one stream per
thread is too thin for this Xeon's prefetcher). `python -m minillm.quant.speed --against OLD.c
--shape llama-3.2-1b --rows 1 8 --repeats 15` (the 112 layer matrices, random weights; 2-core
Xeon, load average ~1 in those minutes, ratios from one run each, new / old):
    float16 scales against float32 ones           1 row 0.932, 0.954 (two runs)   8 rows 0.971
    + the prefetch against float16 scales alone   1 row 0.777 (32.1 ms, 18.9 GB/s of the
                                                  new bytes)                      8 rows 0.890
so about 0.74 of the time at one row in all. Under a load of 5-6 the same A/B read 0.784
(prefetch) and 0.915 / 0.972 (both against the old file): direction the same, less clear.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from ..models.cpu_linear import PANEL, panel_output
from ..utils.c_kernels import INT, PTR, CKernel, define_op
from .int4 import Int4Linear
from .reference import ACTIVATION_BLOCK, fake_quantize_activations

SOURCE = Path(__file__).with_name("w4a8_linear.c")
FUNCTIONS = {"w4a8_linear": ([PTR, INT, INT, PTR, PTR, PTR, INT, INT, PTR, INT], INT), "w4a8_has_vnni": ([], INT)}
KERNEL = CKernel(SOURCE, FUNCTIONS)
PORTABLE = CKernel(SOURCE, FUNCTIONS, ("-mno-avx512vnni",))    # the plain C loop, even where VNNI is
__getattr__ = KERNEL.module_getattr(__name__)     # w4a8.load_error: why it did not build


def load_w4a8_kernel(portable: bool = False):
    """The C library (w4a8_linear, w4a8_has_vnni) or None (reason in `load_error`). `portable`
    builds it without VNNI, so the plain C path is tested on machines that have VNNI."""
    return (PORTABLE if portable else KERNEL).load()


def pack_w4a8_panels(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] in 0..15 -> [N / PANEL, K / 8, PANEL, 4]: for inputs k0..k0+7 of column
    c, byte j holds input k0+j in its low nibble and k0+4+j in its high one (w4a8_linear.c)."""
    n, k = codes.shape
    eights = codes.reshape(n, k // 8, 2, 4)                      # [N, K/8, low|high, j]
    bytes_ = eights[:, :, 0] | (eights[:, :, 1] << 4)             # [N, K/8, 4]
    return bytes_.reshape(n // PANEL, PANEL, k // 8, 4).transpose(1, 2).contiguous()


def w4a8_matmul(x: torch.Tensor, panels: torch.Tensor, scale_panels: torch.Tensor,
                minimum_panels: torch.Tensor, group_size: int, lib=None) -> torch.Tensor:
    """x float32 [M, K] -> [M, N] via w4a8_linear: the C++ op where it is built (and while
    compiling), else ctypes; `lib` (a build such as the portable one): ctypes into that library."""
    if lib is None and (KERNEL.native or torch.compiler.is_compiling()):
        return torch.ops.minillm.w4a8_linear(x, panels, scale_panels, minimum_panels, group_size)
    return w4a8_ctypes(x, panels, scale_panels, minimum_panels, group_size, lib)


def w4a8_ctypes(x: torch.Tensor, panels: torch.Tensor, scale_panels: torch.Tensor,
                minimum_panels: torch.Tensor, group_size: int, lib=None) -> torch.Tensor:
    """w4a8_linear called with ctypes: the op's Python fallback where its C++ wrapper is not built."""
    m, k = x.shape
    if scale_panels.dtype != torch.float16 or minimum_panels.dtype != torch.float16:
        raise ValueError(f"w4a8_linear reads float16 scale and minimum panels, got {scale_panels.dtype}, "
                         f"{minimum_panels.dtype}")
    if x.dtype != torch.float32 or k % group_size or group_size % ACTIVATION_BLOCK:
        raise ValueError(f"w4a8_linear takes float32 [M, K] with K a multiple of group_size and group_size "
                         f"of {ACTIVATION_BLOCK}; got {x.dtype} [{m}, {k}], group_size {group_size}")
    x = x.contiguous()
    n = panels.shape[0] * PANEL
    y = torch.empty(m, n, dtype=torch.float32)
    if (lib or load_w4a8_kernel()).w4a8_linear(
            x.data_ptr(), m, k, panels.data_ptr(), scale_panels.data_ptr(), minimum_panels.data_ptr(),
            group_size, n, y.data_ptr(), torch.get_num_threads()):
        raise MemoryError(f"w4a8_linear could not allocate the int8 activations of a {m} x {k} input")
    return y


# A torch op, so a compiled decode step (compiled_decode.py) keeps the kernel in its graph; its CPU
# kernel is torch_ops.cpp's wrapper once KERNEL loads (utils/native_ops.py), else w4a8_ctypes.
define_op("w4a8_linear(Tensor x, Tensor panels, Tensor scale_panels, Tensor minimum_panels, int group_size) "
          "-> Tensor", w4a8_ctypes, panel_output, KERNEL, "w4a8_linear")


class W4A8Linear(Int4Linear):
    name = "w4a8"
    load_c_kernel = staticmethod(load_w4a8_kernel)
    pack_codes = staticmethod(pack_w4a8_panels)
    scale_dtype = torch.float16          # stored and read as float16: 0.625 bytes a weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self._padded(x if x.dim() == 2 else x.reshape(-1, self.in_features))   # K: a multiple of G
        if x.device.type == "cpu" and x.dtype == torch.float32 and self.use_c_kernel:
            y = w4a8_matmul(rows, self.panels, self.scale_panels, self.minimum_panels, self.group_size)
            y = y if self.bias is None else y + self.bias
        else:                               # in float32 whatever x is, then back to x's dtype
            rounded = fake_quantize_activations(rows, ACTIVATION_BLOCK)[:, :self.in_features]
            bias = None if self.bias is None else self.bias.float()
            y = F.linear(rounded, self.dequantized_weight(), bias).to(x.dtype)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)
