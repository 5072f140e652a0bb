"""The model an engine runs: its own module tree, so it never changes a model another engine uses.

An engine rewrites the model it runs: it stacks each layer's q/k/v and gate/up projections
into one linear each (models/fused_layer.py: fewer, fatter calls a step), on CPU it swaps large
linears for PanelLinear (weights packed for small batches), with `quantization` it swaps linears for quantized ones, with
another `dtype`/`device` it converts. Done in place on the caller's model, a second engine
built on the same object (a lesson's float engine beside an int8 one) would silently run the
first one's changes. So the runner builds its own tree:

  - new module objects and new Parameter objects over the SAME tensors (no copy of a weight),
    then every swap and conversion happens on that tree only;
  - a float32 CPU model is laid out column-major in place first (same values, same shapes and
    state dict; F.linear reads it 1.5-3x faster at decode: LlamaForCausalLM.use_column_major_weights),
    with each layer's q/k/v and gate/up as row blocks of one tensor (fused_layer.share_stacked_weights).
    That byte order is the one thing an engine does to the model it is handed; it changes no value,
    and doing it on a copy would double the weights' memory.

Memory, beside the handed model's weights (which stay shared, the stacked q/k/v and gate/up too:
the handed float32 CPU model's projections are laid out once as row blocks of one tensor each,
`share_stacked_weights`), PanelLinear's packed copy of
each large CPU linear (as before this tree existed), quantized weights when asked for (an
`LLM(quantization=...)` holds no other reference to its float model, so the float linears
are freed), and a full converted copy when another dtype or device is asked for.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..models.cpu_linear import use_panel_linears
from ..models.fused_layer import fuse_decoder_layers, share_stacked_weights
from ..quant import quantize_model


def own_module_tree(model: nn.Module) -> nn.Module:
    """A copy of the module tree whose Parameters are new objects over the same tensors
    (weight tying kept: one shared Parameter stays one). Replacing a submodule, or `.to()`,
    on the copy leaves the original untouched; no weight is copied."""
    params: dict[int, nn.Parameter] = {}
    modules: dict[int, nn.Module] = {}

    def copy_module(m: nn.Module) -> nn.Module:
        if id(m) in modules:
            return modules[id(m)]
        new = modules[id(m)] = copy.copy(m)       # same attributes (config, flags), a new object
        new._parameters = {}
        for name, p in m._parameters.items():
            if p is not None and id(p) not in params:
                params[id(p)] = nn.Parameter(p.detach(), requires_grad=p.requires_grad)
            new._parameters[name] = None if p is None else params[id(p)]
        new._buffers = dict(m._buffers)
        new._modules = {name: None if c is None else copy_module(c) for name, c in m._modules.items()}
        return new
    return copy_module(model)


def model_for_engine(model: nn.Module, device: torch.device, dtype: torch.dtype,
                     quantization: str | None) -> nn.Module:
    """The engine's own model (module doc): on `device` in `dtype`, CPU decode layout, quantized."""
    converted = model.device != device or model.dtype != dtype
    if not converted and model.device.type == "cpu" and dtype == torch.float32:
        lay_out_column_major_once(model)
    own = own_module_tree(model)
    if converted:
        own = own.to(device=device, dtype=dtype)
        if device.type == "cpu":
            own.use_column_major_weights()
    fuse_decoder_layers(own)
    if device.type == "cpu":
        use_panel_linears(own)
    if quantization is not None:
        quantize_model(own, quantization)
    return own


def lay_out_column_major_once(model: nn.Module) -> None:
    if not getattr(model, "_placed", False):           # load_model's models are laid out already
        model.use_column_major_weights()
        model._placed = True
    share_stacked_weights(model)                       # once: a no-op when already laid out so
