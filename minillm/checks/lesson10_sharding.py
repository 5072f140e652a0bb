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

The grader has two halves (`course/collect.py`): `lesson10_ranks.collect_sharding` shards and runs
the layer on the ranks and records the shards, outputs and all-reduces as data (in the grading
sandbox, where the learner's function is; the layer drawn from the judge's seed);
`judge_layer_sharding` judges the record here, against the unsharded layer drawn from the same seed.
"""
from __future__ import annotations

import threading
from types import SimpleNamespace

import torch

from . import lesson10_ranks
from .collected import is_error, rebuilt
from .harness import Grader, expect, grader
from .lesson10_ranks import CASES, TOKENS, collect_sharding, reference_layer
from .lesson10_ranks import linear_of as _linear

HELPERS = ("column_shard(linear, start, size) keeps rows start..start+size of the weight [out, in] (and of the "
           "bias); row_shard(linear, start, size) keeps its columns; RowParallelLinear(linear, group) runs the "
           "linear, then group.all_reduce")


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


def _outcome(out):
    """A rank's collected output: a tensor, the exception it raised, or what else it returned."""
    if is_error(out):
        return rebuilt(out)
    return out if isinstance(out, torch.Tensor) else SimpleNamespace(kind=str(out.get("returned", "?")))


def _check_half(g, what, run, want, cfg, n, row_parallel, hidden) -> None:
    with g.case(f"running the {what} of your sharded layer on {n} ranks"):
        if "hung" in run:
            raise rebuilt(run["hung"])
    expect(len(run["outs"]) == len(run["reduced"]) == n, f"collected {len(run['outs'])} outputs for {n} ranks")
    outs = [_outcome(o) for o in run["outs"]]
    for rank, out in enumerate(outs):
        if isinstance(out, threading.BrokenBarrierError):
            raise AssertionError(
                f"in the {what}, a rank waited {lesson10_ranks.BARRIER_TIMEOUT_S:.0f} s in an all-reduce that its "
                f"peers never reached\n    Hint: every rank must run the same collectives in the same order (no "
                "`if rank == 0:` around an all-reduce)")
        if isinstance(out, BaseException):
            raise AssertionError(f"your sharded layer raised {type(out).__name__} on rank {rank}: {out}\n"
                                 f"    while running the {what} on {n} ranks")
    for rank, reduced in enumerate(run["reduced"]):
        widths = [s[-1] for s in reduced]
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
               f"rank {rank}'s {what} returned {getattr(out, 'shape', None) or getattr(out, 'kind', '?')}, expected "
               f"a tensor of shape {list(want.shape)}")
        err = float((out - want).abs().max())
        expect(torch.allclose(out, want, rtol=1e-4, atol=1e-5),
               f"rank {rank}'s {what} differs from the unsharded layer's by up to {err:.3g}\n    Hint: check the "
               f"shards (each rank's heads with the KV heads they read, the matching columns of {row_parallel}) "
               "and that one all-reduce adds the ranks' partial sums")


def _as_layer(view: dict) -> SimpleNamespace:
    """A collected shard (`lesson10_ranks.shard_view`) with the layer's attribute paths."""
    parts = {}
    for part, attrs in view.items():
        parts[part] = SimpleNamespace(**{k: SimpleNamespace(**v) if isinstance(v, dict) else v
                                         for k, v in attrs.items()})
    return SimpleNamespace(**parts)


def _check_case(g, data: dict, what: str, fields: dict, n: int, seed: int) -> None:
    """One case's collected data (`lesson10_ranks.collect_sharding`) against the unsharded layer."""
    from ..attention.no_cache import NoCache
    cfg, ref, x, cos, sin = reference_layer(fields, seed)
    for rank, called in enumerate(data["calls"]):
        with g.case(f"calling shard_decoder_layer(layer, rank={rank}, n={n}, group) ({what})"):
            if called is not None:
                raise rebuilt(called)
    if is_error(data["shards"]):
        raise rebuilt(data["shards"])
    expect(len(data["calls"]) == len(data["shards"]) == n, f"collected {len(data['shards'])} shards for {n} ranks")
    for rank, view in enumerate(data["shards"]):
        _check_shards(ref, _as_layer(view), cfg, rank, n)
    with torch.no_grad():
        h = ref.input_layernorm(x)
        attn_want = ref.self_attn(h, cos, sin, NoCache([TOKENS]))
        mlp_want = ref.mlp(h)
        layer_want = ref(x, cos, sin, NoCache([TOKENS]))
    hidden, runs = cfg.hidden_size, data["runs"]
    _check_half(g, f"attention half ({what})", runs[0], attn_want, cfg, n, "o_proj", hidden)
    _check_half(g, f"MLP half ({what})", runs[1], mlp_want, cfg, n, "down_proj", hidden)
    with g.case(f"running your whole sharded layer on {n} ranks ({what})"):
        if "hung" in runs[2]:
            raise rebuilt(runs[2]["hung"])
    expect(len(runs[2]["outs"]) == len(runs[2]["reduced"]) == n,
           f"collected {len(runs[2]['outs'])} outputs for {n} ranks")
    for rank, (out, reduced) in enumerate(zip(map(_outcome, runs[2]["outs"]), runs[2]["reduced"])):
        if isinstance(out, BaseException):
            raise AssertionError(f"your sharded layer raised {type(out).__name__} on rank {rank}: {out}\n"
                                 f"    while running the whole layer on {n} ranks ({what})")
        expect(len(reduced) == 2, f"the whole layer did {len(reduced)} all-reduces on rank {rank}, expected 2 "
                                  "(one per half)")
        expect(isinstance(out, torch.Tensor) and out.shape == layer_want.shape,
               f"rank {rank}'s whole layer returned {getattr(out, 'shape', None) or getattr(out, 'kind', '?')}, "
               f"expected a tensor of shape {list(layer_want.shape)}")
        expect(torch.allclose(out, layer_want, rtol=1e-4, atol=1e-5),
               f"rank {rank}'s output of the whole layer differs from the unsharded layer's by up to "
               f"{float((out - layer_want).abs().max()):.3g} ({what}), although each half matched\n    Hint: shard "
               "only the linears and the head counts; the norms and residuals run in full on every rank")


def judge_layer_sharding(collect, seed: int = 10) -> bool:
    """The judge half (`course/collect.py`): collect(case=i, seed=...) is what the learner's
    function did on case i (`lesson10_ranks.collect_sharding`, in the grading sandbox or here),
    compared here with the unsharded layer drawn from the same seed."""
    g = Grader("check_layer_sharding", "your shard_decoder_layer")
    for i, (what, fields, n) in enumerate(CASES):
        _check_case(g, collect(case=i, seed=seed + i), what, fields, n, seed + i)
    return g.passed()


@grader
def check_layer_sharding(fn) -> bool:
    """fn(layer, rank, n, group) turns a DecoderLayer into rank's shard in place, like
    `minillm.distributed.sharding.shard_decoder_layer`; checked on N ranks run as threads (the
    collect half, `lesson10_ranks.collect_sharding`), judged by `judge_layer_sharding`."""
    expect(callable(fn), f"check_layer_sharding takes your function shard_decoder_layer, got {fn!r}")
    return judge_layer_sharding(lambda **inputs: collect_sharding(fn, **inputs))
