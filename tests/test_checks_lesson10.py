"""Tests of the graders of lesson 10 (minillm.checks.lesson10_sharding, lesson10_router).

The references pass each one, and planted mistakes are rejected with a hint that names the
problem: for the layer sharding a missing all-reduce, a reduce after a column-parallel layer, the
KV heads sliced with the query heads' count or interleaved, a row-parallel linear sliced on the
wrong dimension, head counts left as they were, a collective only one rank reaches; for the
routing decision load ignored, the bound's "more than" read as "at least", ties to the highest
index, and the rest. Addressable per lesson task: `pytest -k check_layer_sharding`,
`pytest -k check_router_choice`.
"""
import time

import pytest
from checks_support import rejects

from minillm import LLMEngine, checks
from minillm.checks import lesson10_ranks
from minillm.distributed.sharding import RowParallelLinear, column_shard, row_shard, shard_decoder_layer
from minillm.server.data_parallel.choice import choose_replica


# ---------------------------------------------------------------- exercise (a): sharding one decoder layer

def sharded(layer, rank, n, group, *, q=None, kv=None, o=None, gate_up=None, down=None, counts=True):
    """The reference with one piece swapped: each keyword a function (linear, rank, n, sizes...) -> module."""
    attn, mlp = layer.self_attn, layer.mlp
    heads, kv_heads, d = attn.num_heads // n, attn.num_kv_heads // n, attn.head_dim
    width = mlp.gate_proj.out_features // n
    attn.q_proj = (q or (lambda lin: column_shard(lin, rank * heads * d, heads * d)))(attn.q_proj)
    kv = kv or (lambda lin: column_shard(lin, rank * kv_heads * d, kv_heads * d))
    attn.k_proj, attn.v_proj = kv(attn.k_proj), kv(attn.v_proj)
    attn.o_proj = (o or (lambda lin: RowParallelLinear(row_shard(lin, rank * heads * d, heads * d), group)))(
        attn.o_proj)
    if counts:
        attn.num_heads, attn.num_kv_heads = heads, kv_heads
    gate_up = gate_up or (lambda lin: column_shard(lin, rank * width, width))
    mlp.gate_proj, mlp.up_proj = gate_up(mlp.gate_proj), gate_up(mlp.up_proj)
    mlp.down_proj = (down or (lambda lin: RowParallelLinear(row_shard(lin, rank * width, width), group)))(
        mlp.down_proj)


def no_all_reduce(layer, rank, n, group):
    heads, d, width = layer.self_attn.num_heads // n, layer.self_attn.head_dim, layer.mlp.gate_proj.out_features // n
    sharded(layer, rank, n, group, o=lambda lin: row_shard(lin, rank * heads * d, heads * d),
            down=lambda lin: row_shard(lin, rank * width, width))


def no_all_reduce_in_the_mlp(layer, rank, n, group):
    width = layer.mlp.gate_proj.out_features // n
    sharded(layer, rank, n, group, down=lambda lin: row_shard(lin, rank * width, width))


def reduce_after_column_parallel(layer, rank, n, group):
    """gate/up wrapped with the all-reduce, down_proj without: the reduce sits before the row-parallel layer."""
    width = layer.mlp.gate_proj.out_features // n
    sharded(layer, rank, n, group, gate_up=lambda lin: RowParallelLinear(column_shard(lin, rank * width, width), group),
            down=lambda lin: row_shard(lin, rank * width, width))


def reduce_after_q(layer, rank, n, group):
    heads, d = layer.self_attn.num_heads // n, layer.self_attn.head_dim
    sharded(layer, rank, n, group, q=lambda lin: RowParallelLinear(column_shard(lin, rank * heads * d, heads * d),
                                                                   group))


def kv_with_query_heads(layer, rank, n, group):
    heads, d = layer.self_attn.num_heads // n, layer.self_attn.head_dim
    sharded(layer, rank, n, group, kv=lambda lin: column_shard(lin, rank * heads * d, heads * d))


def kv_interleaved(layer, rank, n, group):
    import torch
    from torch import nn
    kv_heads, d = layer.self_attn.num_kv_heads // n, layer.self_attn.head_dim

    def take(lin):
        rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in range(rank, kv_heads * n, n)])
        out = nn.Linear(lin.in_features, len(rows), bias=lin.bias is not None)
        out.weight = nn.Parameter(lin.weight.detach()[rows].clone(), requires_grad=False)
        if lin.bias is not None:
            out.bias = nn.Parameter(lin.bias.detach()[rows].clone(), requires_grad=False)
        return out
    sharded(layer, rank, n, group, kv=take)


def kv_unsharded(layer, rank, n, group):
    sharded(layer, rank, n, group, kv=lambda lin: lin)


def o_proj_on_the_wrong_dimension(layer, rank, n, group):
    heads, d = layer.self_attn.num_heads // n, layer.self_attn.head_dim
    sharded(layer, rank, n, group, o=lambda lin: RowParallelLinear(column_shard(lin, rank * heads * d, heads * d),
                                                                   group))


def down_proj_on_the_wrong_dimension(layer, rank, n, group):
    width = layer.mlp.gate_proj.out_features // n
    sharded(layer, rank, n, group, down=lambda lin: RowParallelLinear(column_shard(lin, rank * width, width), group))


def gate_on_the_wrong_dimension(layer, rank, n, group):
    width = layer.mlp.gate_proj.out_features // n
    sharded(layer, rank, n, group, gate_up=lambda lin: row_shard(lin, rank * width, width))


def head_counts_unchanged(layer, rank, n, group):
    sharded(layer, rank, n, group, counts=False)


def q_offset_in_heads_not_rows(layer, rank, n, group):
    heads, d = layer.self_attn.num_heads // n, layer.self_attn.head_dim
    sharded(layer, rank, n, group, q=lambda lin: column_shard(lin, rank * heads, heads * d))


def o_proj_columns_of_another_rank(layer, rank, n, group):
    heads, d = layer.self_attn.num_heads // n, layer.self_attn.head_dim
    other = (rank + 1) % n
    sharded(layer, rank, n, group, o=lambda lin: RowParallelLinear(row_shard(lin, other * heads * d, heads * d), group))


def reduces_twice(layer, rank, n, group):
    heads, d = layer.self_attn.num_heads // n, layer.self_attn.head_dim
    sharded(layer, rank, n, group, o=lambda lin: RowParallelLinear(RowParallelLinear(
        row_shard(lin, rank * heads * d, heads * d), group), group))


def only_rank_0_reduces(layer, rank, n, group):
    heads, d = layer.self_attn.num_heads // n, layer.self_attn.head_dim
    if rank == 0:
        sharded(layer, rank, n, group)
    else:
        sharded(layer, rank, n, group, o=lambda lin: row_shard(lin, rank * heads * d, heads * d))


def stub(layer, rank, n, group):
    raise NotImplementedError("YOUR CODE HERE")


def test_check_layer_sharding_passes_the_reference():
    assert checks.check_layer_sharding(shard_decoder_layer)


def test_check_layer_sharding_is_fast():
    start = time.perf_counter()
    checks.check_layer_sharding(shard_decoder_layer)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("bad, match", [
    (no_all_reduce, r"attention half .* did no all-reduce on rank 0.*partial sum.*RowParallelLinear"),
    (no_all_reduce_in_the_mlp, r"MLP half .* did no all-reduce.*down_proj output is a partial sum"),
    (reduce_after_column_parallel, r"MLP half .* all-reduced a tensor of width 32 \(the width of this rank's "
                                   r"gate_proj or up_proj output\).*No collective after a column-parallel linear"),
    (reduce_after_q, r"attention half .* width 24 \(the width of this rank's q_proj output\).*column-parallel"),
    (kv_with_query_heads, r"k_proj weight has shape \[16, 40\], expected \[8, 40\].*query heads' count"),
    (kv_unsharded, r"k_proj weight has shape \[16, 40\].*or did not shard it"),
    (kv_interleaved, r"k_proj holds KV heads \[0, 2\] \(interleaved.*expected \[0, 1\].*contiguous"),
    (o_proj_on_the_wrong_dimension, r"o_proj weight has shape \[24, 48\], expected \[40, 24\].*row-parallel.*not "
                                    r"rows \(column_shard\)"),
    (down_proj_on_the_wrong_dimension, r"down_proj weight has shape .*row-parallel.*not rows"),
    (gate_on_the_wrong_dimension, r"gate_proj .*column-parallel: slice the rows.*you sliced the columns"),
    (head_counts_unchanged, r"num_heads, num_kv_heads are 12, 4; expected 6, 2"),
    (q_offset_in_heads_not_rows, r"rank 1's q_proj weight holds the wrong rows.*expected rows 24..47"),
    (o_proj_columns_of_another_rank, r"rank 0's o_proj weight holds the wrong columns.*columns 0..23"),
    (reduces_twice, r"attention half .* did 2 all-reduces on rank 0, expected one"),
    (stub, "not implemented yet"),
], ids=lambda v: getattr(v, "__name__", ""))
def test_check_layer_sharding_rejects(bad, match):
    rejects(checks.check_layer_sharding, bad, "(?s)" + match)


def test_check_layer_sharding_rejects_a_collective_one_rank_skips(monkeypatch):
    monkeypatch.setattr(lesson10_ranks, "BARRIER_TIMEOUT_S", 0.5)
    rejects(checks.check_layer_sharding, only_rank_0_reduces, r"(?s)waited .* in an all-reduce that its peers never "
                                                              r"reached.*same collectives in the same order")


def test_the_thread_group_sums_every_rank_in_place():
    import torch
    groups = lesson10_ranks.ranks_of(3)
    outs = lesson10_ranks.run_ranks(lambda r: groups[r].all_reduce(torch.full((2,), float(r + 1))), 3)
    assert all(torch.equal(o, torch.full((2,), 6.0)) for o in outs)
    assert [g.reduced for g in groups] == [[(2,)]] * 3


# ---------------------------------------------------------------- exercise (b): the routing decision

def ignores_load(match_lengths, in_flight, load_bound):
    return max(range(len(match_lengths)), key=lambda i: (match_lengths[i], -i))


def at_least_the_bound(match_lengths, in_flight, load_bound):
    replicas = range(len(match_lengths))
    least = min(replicas, key=lambda i: (in_flight[i], i))
    best = min(replicas, key=lambda i: (-match_lengths[i], in_flight[i], i))
    return least if in_flight[best] - in_flight[least] >= load_bound else best


def bound_from_zero(match_lengths, in_flight, load_bound):
    replicas = range(len(match_lengths))
    least = min(replicas, key=lambda i: (in_flight[i], i))
    best = min(replicas, key=lambda i: (-match_lengths[i], in_flight[i], i))
    return least if in_flight[best] > load_bound else best


def next_best_match(match_lengths, in_flight, load_bound):
    replicas = range(len(match_lengths))
    least = min(in_flight)
    ranked = sorted(replicas, key=lambda i: (-match_lengths[i], in_flight[i], i))
    return next((i for i in ranked if in_flight[i] - least <= load_bound), ranked[0])


def ties_to_highest_index(match_lengths, in_flight, load_bound):
    replicas = range(len(match_lengths))
    least = max(replicas, key=lambda i: (-in_flight[i], i))
    best = max(replicas, key=lambda i: (match_lengths[i], -in_flight[i], i))
    return least if in_flight[best] - in_flight[least] > load_bound else best


def ties_ignore_load(match_lengths, in_flight, load_bound):
    replicas = range(len(match_lengths))
    least = min(replicas, key=lambda i: (in_flight[i], i))
    best = min(replicas, key=lambda i: (-match_lengths[i], i))
    return least if in_flight[best] - in_flight[least] > load_bound else best


def ignores_the_bound(match_lengths, in_flight, load_bound):
    return min(range(len(match_lengths)), key=lambda i: (-match_lengths[i], in_flight[i], i))


def always_least_loaded(match_lengths, in_flight, load_bound):
    return min(range(len(in_flight)), key=lambda i: (in_flight[i], i))


def returns_the_match_length(match_lengths, in_flight, load_bound):
    return max(match_lengths)


def sorts_in_place(match_lengths, in_flight, load_bound):
    i = choose_replica(match_lengths, in_flight, load_bound)
    in_flight[i] += 1                                     # counting it in flight is the router's business
    return i


def no_length_check(match_lengths, in_flight, load_bound):
    replicas = range(min(len(match_lengths), len(in_flight)))
    if not replicas:
        return 0
    least = min(replicas, key=lambda i: (in_flight[i], i))
    best = min(replicas, key=lambda i: (-match_lengths[i], in_flight[i], i))
    return least if in_flight[best] - in_flight[least] > load_bound else best


def router_stub(match_lengths, in_flight, load_bound):
    raise NotImplementedError("YOUR CODE HERE")


def test_check_router_choice_passes_the_reference():
    assert checks.check_router_choice(choose_replica)


@pytest.mark.parametrize("bad, match", [
    (ignores_load, r"equal matches: fewer in flight.*returned 0, expected 1"),
    (at_least_the_bound, r"exactly at the bound still wins.*\*more\* than the bound"),
    (bound_from_zero, r"the bound is counted from the least loaded.*not in_flight\[best\] alone"),
    (next_best_match, r"past the bound: the least loaded: .*returned 2, expected 0.*not to the next-best match"),
    (ties_to_highest_index, r"a full tie: the lowest index.*returned 1, expected 0.*not max"),
    (ties_ignore_load, r"equal matches: fewer in flight.*returned 0, expected 1"),
    (ignores_the_bound, r"past the bound: the least loaded: .*returned 1, expected 0"),
    (always_least_loaded, r"the longest match wins.*returned 0, expected 1"),
    (returns_the_match_length, r"returned 48: return an index of the replicas"),
    (sorts_in_place, r"changed its lists.*the decision only reads them"),
    (no_length_check, r"did not raise ValueError"),
    (router_stub, "not implemented yet"),
], ids=lambda v: getattr(v, "__name__", ""))
def test_check_router_choice_rejects(bad, match):
    rejects(checks.check_router_choice, bad, "(?s)" + match)


# ---------------------------------------------------------------- the seams the lesson plugs the pieces into

NOTEBOOK_CELL = '''
def shard_decoder_layer(layer, rank, n, group):
    raise RuntimeError(f"rank {rank} of {n} ran the notebook's own function")
'''


def notebook_function(name):
    """A function as a notebook defines it: in __main__'s namespace, no module to import it from."""
    namespace = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_CELL, "<notebook cell 1>", "exec"), namespace)
    return namespace[name]


def test_a_notebook_function_reaches_the_ranks_by_value():
    """The executor sends shard_layer_fn with cloudpickle; each spawned rank runs it (here it raises,
    which ends the engine's start with the rank's message)."""
    from minillm.distributed.executor import TensorParallelError
    from conftest import get_model
    model, tokenizer, _ = get_model("tiny-llama")
    with pytest.raises(TensorParallelError, match=r"rank \d of 2 ran the notebook's own function"):
        LLMEngine(model, tokenizer, num_kv_blocks=16, tensor_parallel_size=2,
                  shard_layer_fn=notebook_function("shard_decoder_layer"))


def test_shard_layer_fn_needs_ranks():
    from conftest import get_model
    model, tokenizer, _ = get_model("tiny-llama")
    with pytest.raises(ValueError, match="shard_layer_fn shards the layers over ranks"):
        LLMEngine(model, tokenizer, num_kv_blocks=16, shard_layer_fn=shard_decoder_layer)


def test_the_router_decides_with_the_function_it_is_given():
    from minillm.server.data_parallel.router import Router
    calls = []

    def last(match_lengths, in_flight, load_bound):
        calls.append((list(match_lengths), list(in_flight), load_bound))
        return len(match_lengths) - 1
    router = Router(3, "cache-aware", load_bound=5, choose=last)
    assert [router.route("a prompt long enough for two chunks, or more").replica for _ in range(2)] == [2, 2]
    assert calls == [([0, 0, 0], [0, 0, 0], 5), ([0, 0, 32], [0, 0, 1], 5)]
