"""`quantize_model(model, method)`: swap the model's float linears for a registered backend, in place.

The forward in models/llama.py never changes: it calls `self.q_proj(x)` and whatever module
sits there answers. So quantization is a module swap, like PanelLinear's (cpu_linear.py).

What is swapped: every projection and MLP linear (nn.Linear or PanelLinear). The output head
only with `include_head=True` (default False: the head is a fifth of SmolLM2's weight bytes,
but its quality cost was not measured yet: `python -m minillm.quant.quality --include-head`). The embedding always stays float: with tied weights
(SmolLM2) the head's weight IS the embedding, so a quantized head holds its own copy.

A model is quantized once. Asking again for the same method (with no options, or the same
ones) is a no-op, so two engines can be built on one model; anything else is refused:
re-quantizing dequantized weights would stack a second rounding on the first.
"""
from __future__ import annotations

from torch import nn

from .registry import LINEAR_BACKENDS, quantization_names

INCLUDE_HEAD_BY_DEFAULT = False


def quantize_model(model: nn.Module, method: str, *, include_head: bool | None = None, **options) -> nn.Module:
    """Replace the linears of `model` by `LINEAR_BACKENDS[method].from_linear(linear, **options)`.
    Sets `model.quantization` (the method) and `model.quantization_options`. Returns the model."""
    if method not in LINEAR_BACKENDS:
        raise ValueError(f"unknown quantization {method!r}; registered: {', '.join(quantization_names())}")
    include_head = INCLUDE_HEAD_BY_DEFAULT if include_head is None else include_head
    wanted = dict(options, include_head=include_head)
    done = getattr(model, "quantization", None)
    if done is not None:
        same = done == method and (not options or wanted == model.quantization_options)
        if same:
            return model
        raise ValueError(f"this model is already quantized ({done}, {model.quantization_options}); "
                         f"quantizing it again ({method}, {wanted}) would round rounded weights: "
                         "load the float model again")
    from ..models.cpu_linear import PanelLinear      # here, not at the top: config.py imports this package
    head = getattr(model, "lm_head", None)
    backend = LINEAR_BACKENDS[method]
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in (nn.Linear, PanelLinear) and (include_head or child is not head):
                setattr(parent, name, backend.from_linear(child, **options))
    model.quantization, model.quantization_options = method, wanted
    return model
