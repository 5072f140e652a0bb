"""`Int4Linear`: 4-bit weights in groups of `group_size` inputs, each group with a scale and a minimum.

Stored: `codes` uint8 [N, K/2], two 4-bit codes per byte (input k in the low nibble, k+1 in
the high one), `scale` and `minimum` [N, K/G] (reference.py's scheme), rounded to float16
values as llama.cpp's Q4_1 stores them: w4a8's kernel reads them as float16 (2 bytes each, a
sixth fewer bytes per weight than float32's 0.75; quality.py says what the rounding costs).
This class keeps them in the model's dtype (its kernel reads float32); W4A8Linear in float16.
Which matmul runs:
  - float32 on CPU, up to MAX_ROWS rows: our C kernel on the codes laid out in panels
    (kernels.py): torch's `aten._weight_int4pack_mm_for_cpu` takes a scalar path for float32;
  - bfloat16/float16 on CPU, up to MAX_ROWS rows: torch's pair, packed on first use,
        packed = aten._convert_weight_to_int4pack_for_cpu(q int32 [N, K] in 0..15, 1)
        y = aten._weight_int4pack_mm_for_cpu(x, packed, G, scale_and_zero [K/G, N, 2])
    with W = (q - 8) * scale + zero, i.e. zero = minimum + 8 * scale (the middle code's value);
  - anything else (prefill chunks, CUDA): dequantize, then F.linear. CUDA has a tinygemm
    kernel (`aten._weight_int4pack_mm`, bfloat16 only, its own layout); not wired here: it
    could not be tested on this machine.
K is padded with zero columns up to a multiple of G (and x with zeros): same product.
Group sizes 32, 64, 128, 256 (what torch's kernel accepts). Default 32: quality.py's docstring.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .base import LinearBackend
from .reference import dequantize_int4, quantize_int4_float16_scales

DEFAULT_GROUP_SIZE = 32
GROUP_SIZES = (32, 64, 128, 256)
MIDDLE_CODE = 8


def unpack_codes(pairs: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] (k low nibble, k+1 high) -> uint8 [N, K] codes 0..15."""
    return torch.stack([pairs & 15, pairs >> 4], dim=-1).reshape(pairs.shape[0], -1)


class Int4Linear(LinearBackend):
    name = "int4"

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor,
                 bias: torch.Tensor | None, in_features: int, group_size: int):
        super().__init__()
        self.out_features, padded = codes.shape
        self.in_features, self.group_size, self.pad = in_features, group_size, padded - in_features
        self.register_buffer("codes", codes[:, 0::2] | (codes[:, 1::2] << 4))      # [N, K/2]
        dtype = self.scale_dtype or scale.dtype
        self.register_buffer("scale", scale.to(dtype))                             # [N, K/G]
        self.register_buffer("minimum", minimum.to(dtype))                         # [N, K/G]
        self.bias = bias
        self.torch_packed = None            # torch's layout, made on the first bfloat16/float16 call
        self.use_c_kernel = (codes.device.type == "cpu" and self.out_features % kernels.PANEL == 0
                             and self.load_c_kernel() is not None)
        if self.use_c_kernel:
            self.register_buffer("panels", self.pack_codes(codes), persistent=False)
            panel_dtype = self.scale_dtype or torch.float32
            self.register_buffer("scale_panels", kernels.to_panels(scale.to(panel_dtype)), persistent=False)
            self.register_buffer("minimum_panels", kernels.to_panels(minimum.to(panel_dtype)), persistent=False)

    # The C kernel, its code layout and the dtype of the scales it reads, None: the model's in
    # storage, float32 in panels (w4a8.py's subclass has its own).
    scale_dtype = None
    load_c_kernel = staticmethod(kernels.load_kernels)
    pack_codes = staticmethod(kernels.pack_int4_panels)

    @classmethod
    def from_linear(cls, linear: nn.Module, group_size: int = DEFAULT_GROUP_SIZE) -> "Int4Linear":
        if group_size not in GROUP_SIZES:
            raise ValueError(f"int4 group_size must be one of {GROUP_SIZES}, got {group_size!r}")
        weight = linear.weight.detach()
        in_features = weight.shape[1]
        codes, scale, minimum = quantize_int4_float16_scales(F.pad(weight, (0, -in_features % group_size)),
                                                             group_size)
        dtype = weight.dtype
        return cls(codes, scale.to(dtype), minimum.to(dtype), linear.bias, in_features, group_size)

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 [N, K] weight this layer multiplies by (padding removed)."""
        weight = dequantize_int4(unpack_codes(self.codes), self.scale, self.minimum, self.group_size)
        return weight[:, :self.in_features]

    def _torch_int4_matmul(self, rows: torch.Tensor) -> torch.Tensor:
        if self.torch_packed is None or self.torch_packed[1].dtype != rows.dtype:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(unpack_codes(self.codes).int(), 1)
            zero = self.minimum.float() + MIDDLE_CODE * self.scale.float()
            scale_and_zero = torch.stack([self.scale.float(), zero], dim=-1).transpose(0, 1).contiguous()
            self.torch_packed = packed, scale_and_zero.to(rows.dtype)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.torch_packed[0], self.group_size,
                                                          self.torch_packed[1])

    def _padded(self, rows: torch.Tensor) -> torch.Tensor:
        """rows with zero columns up to the padded K, contiguous (no copy when there is nothing to do)."""
        return (F.pad(rows, (0, self.pad)) if self.pad else rows).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        small = x.device.type == "cpu" and rows.shape[0] <= kernels.MAX_ROWS
        if small and x.dtype == torch.float32 and self.use_c_kernel:
            y = kernels.int4_matmul(self._padded(rows), self.panels, self.scale_panels,
                                    self.minimum_panels, self.group_size)
        elif small and x.dtype in (torch.bfloat16, torch.float16) and self.out_features % 16 == 0:
            y = self._torch_int4_matmul(self._padded(rows))
        else:
            y = F.linear(rows, self.dequantized_weight().to(x.dtype))
        y = y if self.bias is None else y + self.bias
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, c_kernel={self.use_c_kernel}")
