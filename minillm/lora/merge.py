"""Merging: the other way to serve a fine-tune, and why it does not scale to many.

An adapter can be folded into the weights once, W' = W + s * B A, and the merged model runs
at the base model's speed with no delta at all. But W' is a whole new copy of every adapted
linear (in practice of the model): N fine-tunes served merged hold N copies, or reload one
per switch. `bench lora` runs it as the yardstick: one merged copy per adapter, its requests
served, then the next.
"""
from __future__ import annotations

import torch

from .adapter import LoRAAdapter

_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


@torch.no_grad()
def merged_copy(model, adapter: LoRAAdapter):
    """A copy of `model` (llama.py's layers, as load_model returns it) with `adapter` merged
    into its weights; `model` is left as it is. The adapted linears get new weight tensors (in
    the original's byte order: column-major stays column-major); the others stay shared."""
    from ..runner.engine_model import own_module_tree
    merged = own_module_tree(model)          # new modules and Parameters over the same tensors
    for (layer, module), (a, b) in adapter.weights.items():
        weight = getattr(getattr(merged.model.layers[layer], _PARENT[module]), module).weight
        delta = adapter.scaling * (b.to(weight.device, torch.float32) @ a.to(weight.device, torch.float32))
        new = (weight.detach().float() + delta).to(weight.dtype)
        weight.data = new.t().contiguous().t() if weight.stride(0) == 1 else new.contiguous()
    return merged


def weight_bytes(model) -> int:
    """Bytes of the model's weights, each storage once (a tied embedding and head count once)."""
    seen, total = set(), 0
    for t in model.state_dict().values():
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total
