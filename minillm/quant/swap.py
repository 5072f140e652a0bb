"""`quantize_model(model, method)`: swap the model's float linears for a registered backend, in place.

The forward in models/llama.py never changes: it calls `self.q_proj(x)` and whatever module
sits there answers. So quantization is a module swap, like PanelLinear's (cpu_linear.py).

What is swapped: every projection and MLP linear (nn.Linear or PanelLinear), and the output head
unless `include_head=False`. The head always gets int8 (HEAD_METHOD), whatever the layers get, as
llama.cpp keeps the output of its 4-bit files at 8 bits: every token is picked from its logits,
and in float32 it would be 113 of an int4 SmolLM2's 193 MB per decode step (int8: 28 MB).
Measured on the embedded model (`python -m minillm.quant.quality`, quality.py's docstring): the
int8 head moves int8's KL from 0.0030 to 0.0044 and int4-g32's from 0.0000 to 0.0012.
The embedding always stays float: with tied weights (SmolLM2) the head's weight IS the
embedding, so a quantized head holds its own copy.

A model is quantized once. Asking again for the same method (with no options, or the same
ones) is a no-op, so two engines can be built on one model; anything else is refused:
re-quantizing dequantized weights would stack a second rounding on the first.
"""
from __future__ import annotations

from torch import nn

from ..utils.registry import LINEAR_BACKENDS

INCLUDE_HEAD_BY_DEFAULT = True
HEAD_METHOD = "int8"


def quantize_model(model: nn.Module, method: str, *, include_head: bool | None = None, **options) -> nn.Module:
    """Replace the linears of `model` by `LINEAR_BACKENDS[method].from_linear(linear, **options)`.
    Sets `model.quantization` (the method) and `model.quantization_options`. Returns the model."""
    backend = LINEAR_BACKENDS.get(method)           # a ValueError listing the known names
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
    head = getattr(head, "linear", head)              # a tensor-parallel head wraps its linear (distributed/)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) not in (nn.Linear, PanelLinear):
                continue
            if child is not head:
                setattr(parent, name, backend.from_linear(child, **options))
            elif include_head:               # the head: 8 bits whatever the layers get (module doc)
                setattr(parent, name, LINEAR_BACKENDS.get(HEAD_METHOD).from_linear(child))
    model.quantization, model.quantization_options = method, wanted
    return model
