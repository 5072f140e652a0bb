"""Lesson 10's sharding grader, `check_layer_sharding`: the learner's
`shard_decoder_layer(layer, rank, n, group)`, which turns one decoder layer into rank's shard in
place (as `minillm.distributed.sharding.shard_decoder_layer` does), checked on N simulated ranks.

The ranks are N threads of this process, each with its own copy of one small random layer and
an in-process group (`lesson10_ranks.ThreadGroup`) whose `all_reduce` sums every rank's tensor
through a `threading.Barrier`, as gloo sums across processes, and records what it was handed. Per case:

  1. the local head counts (`self_attn.num_heads`, `num_kv_heads`), then each linear's shard,
     shape and values, against the slice it should be: q/k/v and gate/up column-parallel (rows of
     the weight [out, in]; rank r's query heads and the KV heads they read, contiguous), o_proj and
     down_proj row-parallel (columns);
  2. the attention half and the MLP half on the N ranks at once: exactly one all-reduce each, of
     hidden_size values (after the row-parallel linear, never after a column-parallel one), and
     the same output as the unsharded half;
  3. the whole layer: two all-reduces, the unsharded layer's output on every rank.

The layers are GQA (more query heads than KV heads, two KV heads per rank in the first case, so
an interleaved shard shows), with every width different from the others (a reduced tensor's width
says which linear it came from), one with biases on q/k/v (Qwen2), and one at N = 4.
"""
from __future__ import annotations

import copy
import threading

import torch
from torch import nn

from . import lesson10_ranks
from .harness import Grader, expect, grader
from .lesson10_ranks import ranks_of, run_ranks

# (what, ModelConfig fields, n): widths chosen all different (hidden, heads x head_dim, KV heads, MLP)
CASES = [
    ("12 query heads, 4 KV heads, 2 ranks", dict(hidden_size=40, intermediate_size=64, num_attention_heads=12,
                                                 num_key_value_heads=4, head_dim=4), 2),
    ("Qwen2-style biases on q/k/v, 2 ranks", dict(hidden_size=36, intermediate_size=56, num_attention_heads=6,
                                                  num_key_value_heads=2, head_dim=8, attention_bias=True,
                                                  model_type="qwen2"), 2),
    ("12 query heads, 4 KV heads, 4 ranks", dict(hidden_size=40, intermediate_size=64, num_attention_heads=12,
                                                 num_key_value_heads=4, head_dim=4), 4),
]
TOKENS = 5

HELPERS = ("column_shard(linear, start, size) keeps rows start..start+size of the weight [out, in] (and of the "
           "bias); row_shard(linear, start, size) keeps its columns; RowParallelLinear(linear, group) runs the "
           "linear, then group.all_reduce")


def reference_layer(fields: dict):
    """A random decoder layer (seeded), its rotary embedding and a small input."""
    from ..config import ModelConfig
    from ..models.llama import DecoderLayer, RotaryEmbedding
    cfg = ModelConfig(vocab_size=32, num_hidden_layers=1, **fields)
    gen = torch.Generator().manual_seed(10)
    layer = DecoderLayer(cfg, 0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() == 2 else 0.1) + (p.dim() == 1))
            p.requires_grad_(False)
    x = torch.randn(TOKENS, cfg.hidden_size, generator=gen)
    cos, sin = RotaryEmbedding(cfg)(torch.arange(TOKENS))
    return cfg, layer.eval(), x, cos, sin


def _linear(module):
    """The weight and bias a (wrapped) linear computes with: its own, or its first nn.Linear's."""
    if isinstance(getattr(module, "weight", None), torch.Tensor):
        return module.weight, getattr(module, "bias", None)
    for m in module.modules() if isinstance(module, nn.Module) else ():
        if isinstance(m, nn.Linear):
            return m.weight, m.bias
    return None, None


def _heads(rows: torch.Tensor, d: int) -> list[int]:
    return sorted({int(r) // d for r in rows})


def _check_column(name, module, full, start, size, rank, n, unit, hint_wrong_size=None):
    """A column-parallel shard: rows start..start+size of the full weight (and bias)."""
    weight, bias = _linear(module)
    expect(weight is not None, f"rank {rank}'s {name} holds no weight: it should be a linear (column_shard of "
                               f"the original)\n    Hint: {HELPERS}")
    fw, fb = full.weight, full.bias
    want = (size, fw.shape[1])
    if tuple(weight.shape) != want:
        hint = hint_wrong_size(tuple(weight.shape)) if hint_wrong_size else None
        if hint:
            pass
        elif weight.shape[1] != fw.shape[1]:
            hint = (f"{name} is column-parallel: slice the rows of its weight [out, in] (its outputs), keeping all "
                    f"{fw.shape[1]} inputs; you sliced the columns (that is row-parallel)")
        elif tuple(weight.shape) == tuple(fw.shape):
            hint = f"{name} was not sharded: rank {rank} of {n} keeps 1/{n} of its {fw.shape[0]} output rows"
        else:
            hint = (f"rank {rank} of {n} keeps {size} of {name}'s {fw.shape[0]} output rows ({unit}), all "
                    f"{fw.shape[1]} inputs")
        raise AssertionError(f"rank {rank}'s {name} weight has shape {list(weight.shape)}, expected {list(want)}"
                             f"\n    Hint: {hint}")
    if not torch.equal(weight, fw[start:start + size]):
        raise AssertionError(f"rank {rank}'s {name} weight holds the wrong rows of the original: expected rows "
                             f"{start}..{start + size - 1} ({unit})\n    Hint: rank r takes the r-th contiguous "
                             f"block of {size} rows: column_shard({name}, r * {size}, {size})")
    if fb is not None:
        expect(bias is not None and tuple(bias.shape) == (size,) and torch.equal(bias, fb[start:start + size]),
               f"rank {rank}'s {name} bias is not rows {start}..{start + size - 1} of the original bias\n    Hint: "
               "a column-parallel linear's bias is sliced like its outputs (column_shard does it)")


def _check_row(name, module, full, start, size, rank, n, unit):
    """A row-parallel shard: columns start..start+size of the full weight."""
    weight, _ = _linear(module)
    expect(weight is not None, f"rank {rank}'s {name} holds no weight: it should be RowParallelLinear(row_shard("
                               f"...), group)\n    Hint: {HELPERS}")
    fw = full.weight
    want = (fw.shape[0], size)
    if tuple(weight.shape) != want:
        if weight.shape[1] == fw.shape[1] and weight.shape[0] != fw.shape[0]:
            hint = (f"{name} is row-parallel: it keeps all {fw.shape[0]} outputs (rows of its weight [out, in]) and "
                    f"takes the {size} input columns that read this rank's {unit}: weight[:, start:start + size] "
                    f"(row_shard), not rows (column_shard): its inputs are what the column-parallel layer before "
                    f"it produced on this rank")
        elif tuple(weight.shape) == tuple(fw.shape):
            hint = f"{name} was not sharded: rank {rank} of {n} keeps 1/{n} of its {fw.shape[1]} input columns"
        else:
            hint = f"rank {rank} of {n} keeps {size} of {name}'s {fw.shape[1]} input columns ({unit})"
        raise AssertionError(f"rank {rank}'s {name} weight has shape {list(weight.shape)}, expected {list(want)}"
                             f"\n    Hint: {hint}")
    expect(torch.equal(weight, fw[:, start:start + size]),
           f"rank {rank}'s {name} weight holds the wrong columns of the original: expected columns {start}.."
           f"{start + size - 1} ({unit})\n    Hint: the columns that read the outputs this rank's column-parallel "
           f"layer produced: row_shard({name}, r * {size}, {size})")


def _check_shards(ref, layer, cfg, rank: int, n: int) -> None:
    attn, mlp, full_attn, full_mlp = layer.self_attn, layer.mlp, ref.self_attn, ref.mlp
    H, KV, d, I = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
    h, kv, w = H // n, KV // n, I // n
    expect((attn.num_heads, attn.num_kv_heads) == (h, kv),
           f"rank {rank}'s self_attn.num_heads, num_kv_heads are {attn.num_heads}, {attn.num_kv_heads}; expected "
           f"{h}, {kv} ({H} and {KV} over {n} ranks)\n    Hint: the attention's forward reshapes q to [tokens, "
           "num_heads, head_dim] and k, v to [tokens, num_kv_heads, head_dim]: set both to this rank's counts")
    q_rows = (rank * h * d, h * d)
    _check_column("q_proj", attn.q_proj, full_attn.q_proj, *q_rows, rank, n,
                  f"query heads {rank * h}..{rank * h + h - 1}",
                  lambda shape: (f"q_proj has {H} query heads x head_dim {d} = {H * d} rows; rank r takes "
                                 f"num_heads // n = {h} heads, {h * d} rows (you took the KV heads' count)")
                  if shape == (kv * d, cfg.hidden_size) else None)
    contiguous = list(range(rank * kv, rank * kv + kv))
    for name in ("k_proj", "v_proj"):
        got, _ = _linear(getattr(attn, name))
        full = getattr(full_attn, name)
        if got is not None and tuple(got.shape) == (kv * d, full.weight.shape[1]):
            interleaved = [rank + j * n for j in range(kv)]
            rows = torch.cat([full.weight[i * d:(i + 1) * d] for i in interleaved])
            expect(interleaved == contiguous or not torch.equal(got, rows),
                   f"rank {rank}'s {name} holds KV heads {interleaved} (interleaved: rank r takes heads r, r + {n}, "
                   f"...), expected {contiguous}\n"
                   f"    Hint: rank {rank} holds query heads {rank * h}..{rank * h + h - 1}, and with GQA query head "
                   f"q reads KV head q // {H // KV} (a group of {H // KV} consecutive query heads per KV head), so it "
                   f"needs KV heads {contiguous}: a contiguous block, column_shard({name}, r * {kv * d}, {kv * d})")
        _check_column(name, getattr(attn, name), full, rank * kv * d, kv * d, rank, n,
                      f"KV heads {contiguous[0]}..{contiguous[-1]}",
                      lambda shape, full=full, name=name: (
                          f"{name} has {KV} KV heads x head_dim {d} = {KV * d} rows (GQA: {KV} KV heads for {H} "
                          f"query heads), so rank r takes num_kv_heads // n = {kv} KV heads: {kv * d} rows from "
                          f"r * {kv * d}. You sliced it like q_proj, with the query heads' count ({h} heads, "
                          f"{h * d} rows per rank), or did not shard it")
                      if shape == tuple(full.weight[rank * h * d:rank * h * d + h * d].shape) else None)
    _check_row("o_proj", attn.o_proj, full_attn.o_proj, rank * h * d, h * d, rank, n,
               f"query heads {rank * h}..{rank * h + h - 1}")
    for name in ("gate_proj", "up_proj"):
        _check_column(name, getattr(mlp, name), getattr(full_mlp, name), rank * w, w, rank, n,
                      f"MLP columns {rank * w}..{rank * w + w - 1} of {I}")
    _check_row("down_proj", mlp.down_proj, full_mlp.down_proj, rank * w, w, rank, n,
               f"MLP columns {rank * w}..{rank * w + w - 1}")


def _where_from(width: int, cfg, n: int) -> str:
    d, h, kv, w = cfg.head_dim, cfg.num_attention_heads // n, cfg.num_key_value_heads // n, cfg.intermediate_size // n
    names = [name for name, size in (("q_proj", h * d), ("k_proj or v_proj", kv * d), ("gate_proj or up_proj", w))
             if size == width]
    return f" (the width of this rank's {' / '.join(names)} output)" if names else ""


def _check_half(g, what, run, want, groups, cfg, n, row_parallel, hidden) -> None:
    for grp in groups:
        grp.reduced.clear()
    with g.case(f"running the {what} of your sharded layer on {n} ranks"):
        outs = run_ranks(run, n)
    for rank, out in enumerate(outs):
        if isinstance(out, threading.BrokenBarrierError):
            raise AssertionError(
                f"in the {what}, a rank waited {lesson10_ranks.BARRIER_TIMEOUT_S:.0f} s in an all-reduce that its "
                f"peers never reached\n    Hint: every rank must run the same collectives in the same order (no "
                "`if rank == 0:` around an all-reduce)")
        if isinstance(out, BaseException):
            raise AssertionError(f"your sharded layer raised {type(out).__name__} on rank {rank}: {out}\n"
                                 f"    while running the {what} on {n} ranks")
    for rank, grp in enumerate(groups):
        widths = [s[-1] for s in grp.reduced]
        local = [x for x in widths if x != hidden]
        expect(not local,
               f"in the {what}, rank {rank} all-reduced a tensor of width {local[0] if local else 0}"
               f"{_where_from(local[0], cfg, n) if local else ''}, not hidden_size {hidden}\n    Hint: a column-"
               "parallel output holds this rank's own heads (or MLP columns): different values, not a partial sum "
               "of the same ones, so summing the ranks' mixes them up. No collective after a column-parallel linear; "
               f"the row-parallel {row_parallel} that reads it locally produces partial sums of the full output, "
               f"and the all-reduce goes after it: RowParallelLinear(row_shard(...), group)")
        expect(widths, f"the {what} did no all-reduce on rank {rank}: its {row_parallel} output is a partial sum "
                       f"(this rank's {'heads' if row_parallel == 'o_proj' else 'MLP columns'} only), and the ranks' "
                       f"partial sums must be added\n    Hint: wrap the row-parallel linear so that an all-reduce "
                       f"follows it: RowParallelLinear(row_shard({row_parallel}, ...), group)")
        expect(len(widths) == 1, f"the {what} did {len(widths)} all-reduces on rank {rank}, expected one (after "
                                 f"{row_parallel})\n    Hint: each all-reduce adds the ranks' values again: reduce "
                                 f"once, right after the row-parallel {row_parallel}")
    for rank, out in enumerate(outs):
        expect(isinstance(out, torch.Tensor) and out.shape == want.shape,
               f"rank {rank}'s {what} returned {getattr(out, 'shape', type(out).__name__)}, expected a tensor of "
               f"shape {list(want.shape)}")
        err = float((out - want).abs().max())
        expect(torch.allclose(out, want, rtol=1e-4, atol=1e-5),
               f"rank {rank}'s {what} differs from the unsharded layer's by up to {err:.3g}\n    Hint: check the "
               f"shards (each rank's heads with the KV heads they read, the matching columns of {row_parallel}) "
               "and that one all-reduce adds the ranks' partial sums")


def _check_case(g, fn, what: str, fields: dict, n: int) -> None:
    from ..attention.no_cache import NoCache
    cfg, ref, x, cos, sin = reference_layer(fields)
    groups = ranks_of(n)
    layers = []
    for rank in range(n):
        layer = copy.deepcopy(ref)
        with g.case(f"calling shard_decoder_layer(layer, rank={rank}, n={n}, group) ({what})"):
            out = fn(layer, rank, n, groups[rank])
        layers.append(out if isinstance(out, nn.Module) else layer)
    for rank, layer in enumerate(layers):
        _check_shards(ref, layer, cfg, rank, n)
    with torch.no_grad():
        h = ref.input_layernorm(x)
        attn_want = ref.self_attn(h, cos, sin, NoCache([TOKENS]))
        mlp_want = ref.mlp(h)
        layer_want = ref(x, cos, sin, NoCache([TOKENS]))
    hidden = cfg.hidden_size
    _check_half(g, f"attention half ({what})", lambda r: layers[r].self_attn(h, cos, sin, NoCache([TOKENS])),
                attn_want, groups, cfg, n, "o_proj", hidden)
    _check_half(g, f"MLP half ({what})", lambda r: layers[r].mlp(h), mlp_want, groups, cfg, n, "down_proj", hidden)
    for grp in groups:
        grp.reduced.clear()
    with g.case(f"running your whole sharded layer on {n} ranks ({what})"):
        outs = run_ranks(lambda r: layers[r](x, cos, sin, NoCache([TOKENS])), n)
    for rank, out in enumerate(outs):
        if isinstance(out, BaseException):
            raise AssertionError(f"your sharded layer raised {type(out).__name__} on rank {rank}: {out}\n"
                                 f"    while running the whole layer on {n} ranks ({what})")
        expect(len(groups[rank].reduced) == 2, f"the whole layer did {len(groups[rank].reduced)} all-reduces on "
                                               f"rank {rank}, expected 2 (one per half)")
        expect(torch.allclose(out, layer_want, rtol=1e-4, atol=1e-5),
               f"rank {rank}'s output of the whole layer differs from the unsharded layer's by up to "
               f"{float((out - layer_want).abs().max()):.3g} ({what}), although each half matched\n    Hint: shard "
               "only the linears and the head counts; the norms and residuals run in full on every rank")


@grader
def check_layer_sharding(fn) -> bool:
    """fn(layer, rank, n, group) turns a DecoderLayer into rank's shard in place, like
    `minillm.distributed.sharding.shard_decoder_layer`; checked on N ranks run as threads."""
    g = Grader("check_layer_sharding", "your shard_decoder_layer")
    expect(callable(fn), f"check_layer_sharding takes your function shard_decoder_layer, got {fn!r}")
    for what, fields, n in CASES:
        _check_case(g, fn, what, fields, n)
    return g.passed()
