"""The engine's linears with LoRA slots: the base GEMM once, then each row's own low-rank delta.

`LoRALinear` wraps one of the engine's linears, stacked ones included: the fused layer runs
q/k/v as one linear and gate/up as another (models/fused_layer.py), so a wrapper knows its
sub-projections and adds each one's delta into its own output columns (q's into the first
H*D columns, k's into the next Hkv*D, ...). An adapter that targets q but not v leaves v's
columns alone. The slots' A and B live in buffers on the model's device (batched_delta.py
says why they are stacked); `StepRows` tells every wrapper which slot each row uses.

The sub-projections' A are rank blocks of one tensor, `A_t` [slots, in, K*r] (`A[k]` [slots, r, in]
is a view of block k), so the packed path (packed_delta.py) shrinks all K at once; B is kept as
`B_t[k]` [slots, r, out] (`B[k]` a view); the wrapped
linear may be any module computing x @ W.T, a quantized one too (the delta stays float).
"""
from __future__ import annotations

import torch
from torch import nn

from . import batched_delta
from .batched_delta import row_deltas
from .packed_delta import StepLayout, packed_delta


class StepRows:
    """Shared by every LoRALinear of a model: each row's slot this step (-1: base), and the scales."""

    def __init__(self, max_loras: int, device):
        self.scale = torch.zeros(max_loras, device=device)
        self.slot_of_row: torch.Tensor | None = None     # None: no row uses an adapter
        self.slots_present: list[int] = []
        self.layout: StepLayout | None = None           # set: the packed path (packed_delta.py)


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Module, subs: list[tuple[str, int]], in_features: int, max_loras: int,
                 max_rank: int, rows: StepRows):
        """`subs`: the (module name, output columns) this linear stacks, in order."""
        super().__init__()
        self.base, self.subs, self.rows = base, subs, rows
        device = rows.scale.device
        # stored transposed, as the packed path's bmm reads them (a transposed view there is 10x slower on CPU)
        self.register_buffer("A_t", torch.zeros(max_loras, in_features, len(subs) * max_rank, device=device),
                             persistent=False)
        self.B_t = [torch.zeros(max_loras, max_rank, out, device=device) for _, out in subs]
        for k, b in enumerate(self.B_t):
            self.register_buffer(f"B_t{k}", b, persistent=False)
        r = max_rank
        self.A = [self.A_t[:, :, k * r:(k + 1) * r].transpose(1, 2) for k in range(len(subs))]   # views [slots, r, in]
        self.B = [b.transpose(1, 2) for b in self.B_t]                                           # views [slots, out, r]
        self.targeted: list[set[int]] = [set() for _ in subs]    # slots whose adapter adapts sub k here

    @torch.no_grad()
    def load(self, slot: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Write an adapter's {module name: (A [r, in], B [out, r])} for this linear into `slot`
        (zeros where the adapter leaves a sub-projection alone, and past its rank)."""
        for k, (name, _) in enumerate(self.subs):
            self.A[k][slot].zero_()
            self.B[k][slot].zero_()
            self.targeted[k].discard(slot)
            if name in weights:
                a, b = weights[name]
                self.A[k][slot, :a.shape[0]].copy_(a)
                self.B[k][slot, :, :b.shape[1]].copy_(b)
                self.targeted[k].add(slot)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        rows = self.rows
        if rows.slot_of_row is None:
            return y
        x2, y2 = x.reshape(-1, x.shape[-1]), y.view(-1, y.shape[-1])
        if x2.shape[0] != rows.slot_of_row.shape[0]:
            raise RuntimeError(f"LoRA: {x2.shape[0]} rows but the step named slots for {rows.slot_of_row.shape[0]}")
        if rows.layout is not None and batched_delta._plugged is None:     # a lesson's plugged delta wins
            if any(s in t for t in self.targeted for s in rows.slots_present):
                packed_delta(x2, y2, self.A_t, self.B_t, rows.scale, rows.layout)
            return y
        start = 0
        for k, (_, out) in enumerate(self.subs):
            present = [s for s in rows.slots_present if s in self.targeted[k]]
            if present:
                delta = row_deltas(x2, self.A[k], self.B[k], rows.scale, rows.slot_of_row, present)
                y2[:, start:start + out] += delta.to(y2.dtype)
            start += out
        return y


def wrap_model(model: nn.Module, max_loras: int, max_rank: int) -> tuple[StepRows, list[dict]]:
    """Wrap every layer's projections in place. Returns the shared StepRows and, per layer,
    {module name: the LoRALinear holding it}."""
    from ..models.fused_layer import FusedDecoderLayer
    from ..models.llama import DecoderLayer
    cfg = model.config
    hidden, d = cfg.hidden_size, cfg.head_dim
    q, kv, inter = cfg.num_attention_heads * d, cfg.num_key_value_heads * d, cfg.intermediate_size
    rows = StepRows(max_loras, next(model.parameters()).device)
    per_layer = []
    for i, layer in enumerate(model.model.layers):
        if type(layer) is FusedDecoderLayer:
            plan = [(layer, "qkv_proj", [("q_proj", q), ("k_proj", kv), ("v_proj", kv)], hidden),
                    (layer, "o_proj", [("o_proj", hidden)], q),
                    (layer, "gate_up_proj", [("gate_proj", inter), ("up_proj", inter)], hidden),
                    (layer, "down_proj", [("down_proj", hidden)], inter)]
        elif type(layer) is DecoderLayer:
            a, m = layer.self_attn, layer.mlp
            plan = [(a, "q_proj", [("q_proj", q)], hidden), (a, "k_proj", [("k_proj", kv)], hidden),
                    (a, "v_proj", [("v_proj", kv)], hidden), (a, "o_proj", [("o_proj", hidden)], q),
                    (m, "gate_proj", [("gate_proj", inter)], hidden), (m, "up_proj", [("up_proj", inter)], hidden),
                    (m, "down_proj", [("down_proj", hidden)], inter)]
        else:
            raise ValueError(f"enable_lora: layer {i} is a {type(layer).__name__}, which LoRA cannot wrap "
                             "(only the engine's own decoder layers)")
        names = {}
        for parent, attr, subs, in_features in plan:
            wrapped = LoRALinear(getattr(parent, attr), subs, in_features, max_loras, max_rank, rows)
            setattr(parent, attr, wrapped)
            names.update({name: wrapped for name, _ in subs})
        per_layer.append(names)
    return rows, per_layer
