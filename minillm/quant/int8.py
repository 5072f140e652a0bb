"""`Int8Linear`: int8 weights, one scale per output channel, float activations.

Which matmul runs (measured, speed.py's docstring):
  - float32 on CPU, up to MAX_ROWS rows: our C kernel on int8 panels (kernels.py), because
    torch's `aten._weight_int8pack_mm` takes a scalar path for float32 activations;
  - bfloat16/float16 on CPU, up to MAX_ROWS rows: torch's `aten._weight_int8pack_mm`
    (x @ (q * scale[:, None]).T, vectorized for these dtypes);
  - anything else (prefill chunks, CUDA, where `_weight_int8pack_mm` has no kernel):
    dequantize, then F.linear. On CUDA that saves memory, not time.
Stored: `q_weight` int8 [N, K] and `scale` [N]; on CPU also the same codes laid out in panels
(non-persistent), so 2 bytes per weight in memory, 1 read per weight at decode.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .base import LinearBackend
from .reference import dequantize_int8, quantize_int8


class Int8Linear(LinearBackend):
    name = "int8"

    def __init__(self, q_weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = q_weight.shape
        # int8 [N, K], row-major: torch's packed op needs it (a CPU model's weights are laid out
        # column-major by place_model, and the codes would inherit that layout)
        self.register_buffer("q_weight", q_weight.contiguous())
        self.register_buffer("scale", scale)                # [N], in the model's float dtype
        self.bias = bias
        self.use_c_kernel = (q_weight.device.type == "cpu" and self.out_features % kernels.PANEL == 0
                             and kernels.load_kernels() is not None)
        if self.use_c_kernel:
            self.register_buffer("panels", kernels.to_panels(q_weight), persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Module) -> "Int8Linear":
        q, scale = quantize_int8(linear.weight)
        return cls(q, scale.to(linear.weight.dtype), linear.bias)

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 [N, K] weight this layer multiplies by."""
        return dequantize_int8(self.q_weight, self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)     # (a reshape is an op: ~1 us)
        small = x.device.type == "cpu" and rows.shape[0] <= kernels.MAX_ROWS
        if small and x.dtype == torch.float32 and self.use_c_kernel:
            y = kernels.int8_matmul(rows.contiguous(), self.panels, self.scale.float())
        elif small and x.dtype in (torch.bfloat16, torch.float16):
            y = torch.ops.aten._weight_int8pack_mm(rows.contiguous(), self.q_weight, self.scale.to(x.dtype))
        else:
            y = F.linear(rows, self.dequantized_weight().to(x.dtype))
        y = y if self.bias is None else y + self.bias
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
