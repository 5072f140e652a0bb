"""Weight-only quantization as a pluggable linear backend (lesson 09).

    reference.py   quantize / dequantize in plain torch: the model answer
    int8.py        Int8Linear: per-channel int8, torch's packed CPU kernel
    int4.py        Int4Linear: group-wise int4, torch's packed CPU kernel
    w4a8.py        W4A8Linear: int4 weights x int8 activations, integer dot products (w4a8_linear.c)
    kernels.py     our C kernels (quantized_linear.c) for float32 activations at decode
    base.py        LinearBackend: the seam every quantized linear implements
    swap.py        quantize_model(model, "int8"): swap the linears in place
    quality.py     KL / perplexity / greedy agreement against float32 (python -m minillm.quant.quality)
    speed.py       kernel timings against the reference and float32 (python -m minillm.quant.speed)

The built-in backends are registered by name in `minillm.utils.registry.LINEAR_BACKENDS` (config.py
validates `quantization=` there without importing this package); a learner's class adds itself with
`register_linear_backend(MyInt8Linear)`.
"""
from .int4 import DEFAULT_GROUP_SIZE, Int4Linear
from .int8 import Int8Linear
from .w4a8 import W4A8Linear
from ..utils.registry import LINEAR_BACKENDS
from .base import LinearBackend
from .swap import quantize_model

register_linear_backend = LINEAR_BACKENDS.register()     # register_linear_backend(cls): cls under cls.name


def quantization_names() -> tuple[str, ...]:
    """What `quantization=` accepts (besides None, which keeps the float weights)."""
    return LINEAR_BACKENDS.names()


__all__ = ["DEFAULT_GROUP_SIZE", "Int4Linear", "Int8Linear", "LINEAR_BACKENDS", "LinearBackend", "quantization_names",
           "quantize_model", "register_linear_backend", "W4A8Linear"]
