"""The decoder layer an engine runs: llama.py's layer with fewer, fatter calls.

llama.py writes a layer the way the architecture diagram draws it: q, k and v as three
projections, gate and up as two, RMSNorm and RoPE as a handful of torch ops each. That is
the lessons' view and it stays. At decode, though, a layer's work is small and each call
has a fixed cost (Python, the op dispatcher, an OpenMP region): 7 linears and ~40 other ops
a layer, 30 layers, is ~1,500 calls a step, where a batch-1 step of SmolLM2 moves only a few
milliseconds' worth of weights. So the engine's own model (runner/engine_model.py) swaps each
`DecoderLayer` for a `FusedDecoderLayer` holding the same weights:

  - `qkv_proj`: q, k and v stacked into one [(H + 2 Hkv) Dh, hidden] linear, split by name
    after the matmul; `gate_up_proj`: gate and up as one [2 I, hidden] linear. Every output
    column is still its own weight row's dot product, so quantizing the stacked weight (per
    output channel, or per group of inputs within a row) gives the same numbers as
    quantizing each piece: int8, int4 and w4a8 are unchanged, and the C kernels see wider,
    fewer matmuls.
  - RMSNorm (the final one too), the residual add + RMSNorm, RoPE + the K/V write, and SiLU(gate) * up
    as one C call each
    (fused_ops.c) in CPU float32 steps; the torch ops otherwise (and for RoPE + the K/V write
    inside torch.compile, which fuses them itself).

The result is the same computation: RoPE bit for bit, the norms up to the order of a sum
(float rounding), the projections up to which kernel runs a matmul. Layers this cannot
fuse (a learner's sharding, a projection already replaced) stay as they are.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import fused_ops
from .cpu_linear import PANEL, PanelLinear, to_panels
from .llama import DecoderLayer, RMSNorm, apply_rope


def rows_of_one_tensor(weights: list[torch.Tensor]) -> torch.Tensor | None:
    """The one column-major tensor these weights are consecutive row blocks of (as
    `share_stacked_weights` lays them out), over the same memory; None if they are not."""
    first, rows = weights[0], sum(w.shape[0] for w in weights)
    offset, storage = first.storage_offset(), first.untyped_storage().data_ptr()
    for w in weights:
        if (w.dim() != 2 or w.stride() != (1, rows) or w.storage_offset() != offset
                or w.untyped_storage().data_ptr() != storage or w.shape[1] != first.shape[1]):
            return None
        offset += w.shape[0]
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), (rows, first.shape[1]),
                                   (1, rows))


def stack_linears(linears: list[nn.Module]) -> nn.Linear:
    """One nn.Linear whose output is the given linears' outputs side by side: over the same memory when
    their weights are row blocks of one tensor (`share_stacked_weights`), else a copy."""
    first = linears[0]
    weights = [lin.weight.detach() for lin in linears]
    weight = rows_of_one_tensor(weights) if first.weight.device.type == "cpu" else None
    if weight is None:
        weight = torch.cat(weights)
        weight = weight.t().contiguous().t() if weight.device.type == "cpu" else weight   # CPU: column-major
    stacked = nn.Linear(first.in_features, weight.shape[0], bias=first.bias is not None,
                        device="meta", dtype=weight.dtype)
    stacked.weight = nn.Parameter(weight, requires_grad=False)
    if first.bias is not None:
        stacked.bias = nn.Parameter(torch.cat([lin.bias.detach() for lin in linears]), requires_grad=False)
    panels = shared_panels(linears) if all(type(lin) is PanelLinear for lin in linears) else None
    if panels is None:
        return stacked
    packed = PanelLinear(stacked, first.kernel)          # its packed copy: the sources' (share_stacked_weights)
    packed.panels = panels
    return packed


def shared_panels(linears: list[PanelLinear]) -> torch.Tensor | None:
    """The one [N / 32, K, 32] tensor these PanelLinears' packed weights are consecutive blocks of, or None."""
    first = linears[0].panels
    offset, storage = first.storage_offset(), first.untyped_storage().data_ptr()
    for lin in linears:
        p = lin.panels
        if (not p.is_contiguous() or p.storage_offset() != offset or p.untyped_storage().data_ptr() != storage
                or p.shape[1:] != first.shape[1:] or lin._weight_identity() != lin.packed_from):
            return None
        offset += p.numel()
    total = sum(lin.panels.shape[0] for lin in linears)
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), (total, *first.shape[1:]))


def projection_groups(layer: DecoderLayer) -> list[tuple[nn.Module, ...]]:
    """The projections a fused layer stacks: q/k/v, and gate/up."""
    attn, mlp = layer.self_attn, layer.mlp
    return [(attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)]


@torch.no_grad()
def share_stacked_weights(model: nn.Module) -> None:
    """Re-lay each fusable layer's q/k/v weights (and gate/up) as row blocks of one column-major tensor,
    in place: same values, shapes and state dict, another byte order, as use_column_major_weights.
    Why: an engine on a float32 CPU model shares its weights (engine_model.py); its stacked linears
    are then these tensors (`stack_linears`), not a second copy of most of the model."""
    for layer in model.model.layers:
        if not can_fuse(layer):
            continue
        for group in projection_groups(layer):
            weights = [lin.weight for lin in group]
            if weights[0].device.type != "cpu" or rows_of_one_tensor(weights) is not None:
                continue
            stacked, start = torch.cat([w.detach() for w in weights]).t().contiguous().t(), 0
            panels = to_panels(stacked) if all(type(lin) is PanelLinear for lin in group) else None
            for lin in group:
                rows = lin.weight.shape[0]
                lin.weight.data = stacked[start:start + rows]
                if panels is not None:   # PanelLinear's packed copy, as blocks of one tensor too
                    lin.panels, lin.packed_from = panels[start // PANEL:(start + rows) // PANEL], lin._weight_identity()
                start += rows


def can_fuse(layer: nn.Module) -> bool:
    """A plain llama.py layer whose projections are still float linears (nn.Linear, or PanelLinear,
    which load_model puts in place of the large ones on CPU), biases alike."""
    if type(layer) is not DecoderLayer:
        return False
    groups = projection_groups(layer)
    return all(type(lin) in (nn.Linear, PanelLinear) and (lin.bias is None) == (group[0].bias is None)
               and lin.weight.dtype == group[0].weight.dtype and lin.weight.device == group[0].weight.device
               for group in groups for lin in group)


class FusedRMSNorm(RMSNorm):
    """llama.py's RMSNorm (same weight) as one C call where fused_ops can take x."""

    def __init__(self, norm: RMSNorm):
        nn.Module.__init__(self)
        self.weight, self.eps = norm.weight, norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = fused_ops.rms_norm(x, self.weight, self.eps)
        return super().forward(x) if out is None else out


class FusedDecoderLayer(nn.Module):
    """DecoderLayer's forward (x, cos, sin, kv) -> x, with q/k/v and gate/up stacked (module doc)."""

    def __init__(self, layer: DecoderLayer):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.layer_idx = attn.layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.input_layernorm = FusedRMSNorm(layer.input_layernorm)
        self.post_attention_layernorm = layer.post_attention_layernorm        # added to the residual: add_rms_norm
        self.qkv_proj = stack_linears([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o_proj = attn.o_proj
        self.has_qk_norm = hasattr(attn, "q_norm")       # a plain bool: hasattr on a module raises inside
        if self.has_qk_norm:
            self.q_norm, self.k_norm = attn.q_norm, attn.k_norm
        self.gate_up_proj = stack_linears([mlp.gate_proj, mlp.up_proj])
        self.down_proj = mlp.down_proj
        self.intermediate_size = mlp.gate_proj.out_features

    def attention(self, x: torch.Tensor, cos, sin, kv) -> torch.Tensor:
        n = x.shape[0]
        qkv = self.qkv_proj(x)
        eager_rope = not (torch.compiler.is_compiling() or self.has_qk_norm)   # (compiled: inductor fuses)
        caches = getattr(kv, "plain_caches", lambda i: None)(self.layer_idx) if eager_rope else None
        q = None if caches is None else fused_ops.rope_write_kv(
            qkv, cos, sin, *caches, self.num_heads, self.num_kv_heads)
        if q is not None:                                   # K/V rotated and stored: attention only
            out = kv.attend_stored(self.layer_idx, q)
        else:
            d = self.head_dim
            q, k, v = qkv.split([self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d], dim=-1)
            q, k, v = q.view(n, -1, d), k.view(n, -1, d), v.view(n, -1, d)
            if self.has_qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            out = kv.attend(self.layer_idx, apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        activated = fused_ops.silu_mul(gate_up)
        if activated is None:
            gate, up = gate_up.split(self.intermediate_size, dim=-1)
            activated = F.silu(gate) * up
        return self.down_proj(activated)

    def forward(self, x, cos, sin, kv):
        attended = self.attention(self.input_layernorm(x), cos, sin, kv)
        post = self.post_attention_layernorm
        fused = fused_ops.add_rms_norm(x, attended, post.weight, post.eps)
        x, h = fused if fused is not None else (x + attended, None)
        return x + self.mlp(post(x) if h is None else h)


def fuse_decoder_layers(model: nn.Module) -> int:
    """Swap every fusable DecoderLayer of `model` for a FusedDecoderLayer, and the final norm for a
    FusedRMSNorm, in place. Returns how many layers."""
    if type(model.model.norm) is RMSNorm:
        model.model.norm = FusedRMSNorm(model.model.norm)
    layers = model.model.layers
    count = 0
    for i, layer in enumerate(layers):
        if can_fuse(layer):
            layers[i] = FusedDecoderLayer(layer)
            count += 1
    return count
