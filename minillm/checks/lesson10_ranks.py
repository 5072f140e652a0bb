"""Lesson 10's simulated ranks: N ranks as N threads of one process, for `check_layer_sharding`,
and the grader's collect half (`course/collect.py`): what the learner's shard_decoder_layer does
on those ranks, as data, judged by `lesson10_sharding`.

`ThreadGroup` has the one collective a sharded decoder layer calls, `all_reduce`, with
torch.distributed's contract (every rank's tensor summed, the sum in place on every rank), and
records the shape of each tensor it was handed, so that the grader can say where a learner put
(or forgot) the all-reduce. The sum goes through a `threading.Barrier` with a timeout, so a rank
that skips a collective its peers reach makes them fail within seconds instead of hanging, as a
real group's timeout would.

`collect_sharding(fn, case, seed)` builds one case's random layer (from the judge's seed), has `fn`
shard a copy per rank, and returns, per rank, the call's error or the shard's head counts and the
weights its linears compute with; then each run (attention half, MLP half, whole layer) on the N
ranks: each rank's output (or its error) and the shapes it all-reduced. It decides nothing.
"""
from __future__ import annotations

import copy
import threading

import torch
from torch import nn

from .collected import error
from .harness import expect

BARRIER_TIMEOUT_S = 10.0     # a rank waiting this long in an all-reduce for its peers: they never came


class _Shared:
    def __init__(self, n: int):
        self.n, self.slots = n, [None] * n
        self.barrier = threading.Barrier(n, timeout=BARRIER_TIMEOUT_S)


class ThreadGroup:
    """Rank `rank` of N ranks run as N threads of one process. `all_reduce(x)` puts the sum of
    every rank's x into x (in place, as torch.distributed does), summed in rank order so that
    every rank gets the same bits; `reduced` lists the shapes it was handed."""

    def __init__(self, rank: int, shared: _Shared):
        self.rank, self.world_size, self._shared = rank, shared.n, shared
        self.reduced: list[tuple[int, ...]] = []

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        s = self._shared
        self.reduced.append(tuple(x.shape))
        s.slots[self.rank] = x.detach().clone()
        s.barrier.wait()
        shapes = sorted({tuple(t.shape) for t in s.slots})
        if len(shapes) > 1:
            raise RuntimeError(f"the ranks handed one all-reduce tensors of different shapes {shapes}")
        total = s.slots[0].clone()
        for t in s.slots[1:]:
            total += t
        s.barrier.wait()
        x.copy_(total)
        return x


def ranks_of(n: int) -> list[ThreadGroup]:
    shared = _Shared(n)
    return [ThreadGroup(r, shared) for r in range(n)]


def run_ranks(work, n: int) -> list:
    """work(rank) on n threads at once; each rank's result (or the exception it raised)."""
    results: list = [None] * n

    def run(rank):
        try:
            with torch.no_grad():                       # grad mode is per thread
                results[rank] = work(rank)
        except BaseException as e:                      # handed back, judged by the caller
            results[rank] = e
    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * BARRIER_TIMEOUT_S)
    expect(not any(t.is_alive() for t in threads),
           "the ranks hung: a rank waits in a collective its peers never reach\n    Hint: every rank must run "
           "the same collectives in the same order (no `if rank == 0:` around an all-reduce)")
    return results


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
LINEARS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def reference_layer(fields: dict, seed: int = 10):
    """A random decoder layer (drawn from `seed`), its rotary embedding and a small input."""
    from ..config import ModelConfig
    from ..models.llama import DecoderLayer, RotaryEmbedding
    cfg = ModelConfig(vocab_size=32, num_hidden_layers=1, **fields)
    gen = torch.Generator().manual_seed(seed)
    layer = DecoderLayer(cfg, 0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() == 2 else 0.1) + (p.dim() == 1))
            p.requires_grad_(False)
    x = torch.randn(TOKENS, cfg.hidden_size, generator=gen)
    cos, sin = RotaryEmbedding(cfg)(torch.arange(TOKENS))
    return cfg, layer.eval(), x, cos, sin


def linear_of(module):
    """The weight and bias a (wrapped) linear computes with: its own, or its first nn.Linear's."""
    if isinstance(getattr(module, "weight", None), torch.Tensor):
        return module.weight, getattr(module, "bias", None)
    for m in module.modules() if isinstance(module, nn.Module) else ():
        if isinstance(m, nn.Linear):
            return m.weight, m.bias
    return None, None


def _value(v):
    return v if v is None or isinstance(v, (bool, int, float, str)) else repr(v)[:200]


def _tensor(t):
    return t.detach().to("cpu").clone() if isinstance(t, torch.Tensor) else None


def shard_view(layer) -> dict:
    """A sharded layer as data: self_attn's head counts, each linear's weight and bias."""
    view = {}
    for part, names in LINEARS.items():
        if not hasattr(layer, part):
            continue
        module, view[part] = getattr(layer, part), {}
        for attr in ("num_heads", "num_kv_heads") if part == "self_attn" else ():
            if hasattr(module, attr):
                view[part][attr] = _value(getattr(module, attr))
        for name in names:
            if hasattr(module, name):
                weight, bias = linear_of(getattr(module, name))
                view[part][name] = {"weight": _tensor(weight), "bias": _tensor(bias)}
    return view


def _outcome(out):
    if isinstance(out, BaseException):
        return error(out)
    return _tensor(out) if isinstance(out, torch.Tensor) else {"returned": type(out).__name__[:80]}


def collect_sharding(fn, case: int, seed: int) -> dict:
    """What fn(layer, rank, n, group) does on CASES[case], its layer drawn from `seed`, as data
    (the module docstring says what); it stops at the first error, where the judge fails."""
    from ..attention.no_cache import NoCache
    _, fields, n = CASES[case]
    cfg, ref, x, cos, sin = reference_layer(fields, seed)
    groups, layers = ranks_of(n), []
    data = {"calls": [], "shards": [], "runs": []}
    for rank in range(n):
        layer = copy.deepcopy(ref)
        try:
            out = fn(layer, rank, n, groups[rank])
        except Exception as e:
            data["calls"].append(error(e))
            return data
        data["calls"].append(None)
        layers.append(out if isinstance(out, nn.Module) else layer)
    try:
        data["shards"] = [shard_view(layer) for layer in layers]
    except Exception as e:
        data["shards"] = error(e)
        return data
    with torch.no_grad():
        h = ref.input_layernorm(x)
    runs = (lambda r: layers[r].self_attn(h, cos, sin, NoCache([TOKENS])), lambda r: layers[r].mlp(h),
            lambda r: layers[r](x, cos, sin, NoCache([TOKENS])))
    for run in runs:
        for grp in groups:
            grp.reduced.clear()
        try:
            outs = run_ranks(run, n)
        except AssertionError as e:                     # the ranks hung
            data["runs"].append({"hung": error(e)})
            return data
        data["runs"].append({"outs": [_outcome(o) for o in outs], "reduced": [list(g.reduced) for g in groups]})
        if any(isinstance(o, BaseException) for o in outs):
            return data
    return data
