"""Weight-only quantization as a pluggable linear backend (lesson 09).

    reference.py   quantize / dequantize in plain torch: the model answer
    int8.py        Int8Linear: per-channel int8, torch's packed CPU kernel
    int4.py        Int4Linear: group-wise int4, torch's packed CPU kernel
    w4a8.py        W4A8Linear: int4 weights x int8 activations, integer dot products (w4a8_linear.c)
    kernels.py     our C kernels (quantized_linear.c) for float32 activations at decode
    registry.py    LINEAR_BACKENDS: name -> class; register_linear_backend(cls)
    swap.py        quantize_model(model, "int8"): swap the linears in place
    quality.py     KL / perplexity / greedy agreement against float32 (python -m minillm.quant.quality)
    speed.py       kernel timings against the reference and float32 (python -m minillm.quant.speed)

This package imports nothing from minillm.models at import time: config.py reads the registry.
"""
from .int4 import DEFAULT_GROUP_SIZE, Int4Linear
from .int8 import Int8Linear
from .w4a8 import W4A8Linear
from .registry import LINEAR_BACKENDS, quantization_names, register_linear_backend
from .swap import quantize_model

__all__ = ["DEFAULT_GROUP_SIZE", "Int4Linear", "Int8Linear", "LINEAR_BACKENDS", "quantization_names",
           "quantize_model", "register_linear_backend", "W4A8Linear"]
