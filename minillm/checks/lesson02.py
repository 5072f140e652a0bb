"""Lesson 02's grader, `check_contiguous_cache`: the learner's ContiguousKVCache, on a
cache pre-filled with garbage, must write each step's k and v exactly where they belong
and nowhere else, and attend causally over each row's own keys; then it runs inside
`generate_static_batch`. A cache that writes to the wrong slot still produces
plausible-looking text, so the grader checks the slots themselves.
"""
from __future__ import annotations

import torch

from ..sampling_params import SamplingParams
from .harness import Grader, expect, expect_tensor, greedy_tie, tiny_model, grader


def _find(store: torch.Tensor, vec: torch.Tensor) -> list[tuple[int, int]]:
    """Where in a [rows, max_len, Hkv, D] store does this [Hkv, D] vector sit?"""
    hit = (store - vec).abs().amax(dim=(-2, -1)) < 1e-6
    return [tuple(int(i) for i in ix) for ix in hit.nonzero()]


def _check_writes(cache, ref, layer, step, k, v):
    """After attend: this step's k/v at (rows[b], start[b] + t) and nothing else changed."""
    rows, start, T = step
    call = f"set_step(rows={rows}, start={start}, num_tokens={T}) then attend(layer {layer})"
    for name, store, ref_store, new in (("k", cache.k[layer], ref.k[layer], k),
                                        ("v", cache.v[layer], ref.v[layer], v)):
        for b, r in enumerate(rows):
            for t in range(T):
                pos, token = start[b] + t, b * T + t
                if torch.allclose(store[r, pos], new[token], atol=1e-6):
                    continue
                found = _find(store, new[token])
                if found:
                    where = f"it sits at (row, position) {found}"
                elif name == "v":
                    where = "V was not stored at all (store v as well as k)"
                else:
                    where = "it is nowhere in the cache"
                raise AssertionError(
                    f"ContiguousKVCache: after {call}, cache.{name}[{layer}][{r}, {pos}] should hold "
                    f"{name} of token {token} of the flat batch (row rows[{b}]={r}, position start[{b}]+{t}); "
                    f"{where}. Token b*T+t of the batch belongs to row rows[b] at position start[b]+t")
        changed = ((store - ref_store).abs().amax(dim=(-2, -1)) > 1e-6).nonzero().tolist()
        expect(not changed, f"ContiguousKVCache: {call} changed cache.{name}[{layer}] at (row, position) "
                            f"{changed[:4]}, slots this step does not write. Only rows in `rows`, at positions "
                            "start..start+num_tokens-1, may change")


def _check_attention(cache, ref, out, expected, layer, step, q):
    """The output must equal causal attention of each query over its own row, keys 0..its position."""
    from ..attention.core import masked_attention

    rows, start, T = step
    call = f"set_step(rows={rows}, start={start}, num_tokens={T}) then attend(layer {layer})"
    expect_tensor(out, q.shape, f"attend after {call}")
    if torch.allclose(out, expected, atol=1e-5, rtol=1e-4):
        return
    B = len(rows)
    bad = ((out - expected).abs().amax(dim=(1, 2)) > 1e-5).view(B, T).nonzero()[0].tolist()
    num_keys = max(start) + T
    keys, values = ref.k[layer][rows, :num_keys], ref.v[layer][rows, :num_keys]
    everything = masked_attention(q.view(B, T, *q.shape[1:]), keys, values,
                                  torch.ones(B, T, keys.shape[1], dtype=torch.bool)).reshape(q.shape)
    hint = ("it attends to slots after the query's own position (apply the causal mask: key j is "
            "visible iff j <= the query's position)" if torch.allclose(out, everything, atol=1e-5) else
            "each query at position p must attend to its own row's keys at positions 0..p only (not to "
            "later slots, not to other rows), with this step's k/v already stored; with GQA each "
            "kv head serves num_heads / num_kv_heads query heads")
    raise AssertionError(f"ContiguousKVCache: after {call}, the attention output of row {rows[bad[0]]} at "
                         f"position {start[bad[0]] + bad[1]} differs from the reference: {hint}")


def _fill_with_garbage(cache, ref, gen, num_heads: int) -> None:
    """Unwritten slots must not matter: every slot of every row is first written with large random
    k and v by the cache's own set_step and attend (so they land wherever the class keeps its
    tensors, in this process or across grading's sandbox), and the reference is given the same
    contents. A mistake made there shows again in the cases after, with its own hint."""
    L, (B, M, Hkv, D) = len(cache.k), cache.k[0].shape
    try:
        cache.set_step(list(range(B)), [0] * B, M)
        for layer in range(L):
            cache.attend(layer, torch.randn(B * M, num_heads, D, generator=gen),
                         torch.randn(B * M, Hkv, D, generator=gen) * 10, torch.randn(B * M, Hkv, D, generator=gen) * 10)
    except Exception:
        pass
    for name in ("k", "v"):
        for layer, tensor in enumerate(getattr(cache, name)):
            getattr(ref, name)[layer].copy_(tensor)


@grader
def check_contiguous_cache(cls) -> bool:
    """cls(num_layers, max_batch_size, max_len, num_kv_heads, head_dim, dtype, device), like
    `kv.contiguous.ContiguousKVCache`: for_model, set_step, attend, per-layer k/v lists of
    [max_batch_size, max_len, num_kv_heads, head_dim] tensors, and `positions` [rows, T]
    after set_step (generate_static_batch feeds it to the model).

    On a cache pre-filled with garbage: after every attend, this step's k and v sit at
    (rows[b], start[b] + t) of the right layer and no other slot changed; outputs equal
    causal attention over each row's own keys (prefill, decode, rows out of order,
    several tokens per row). Then `generate_static_batch(..., cache_cls=cls)` on
    tiny-llama with 3 prompts of different lengths gives the reference's greedy tokens.
    """
    from ..kv.contiguous import ContiguousKVCache
    from ..baselines.static_batching import generate_static_batch

    g = Grader("check_contiguous_cache", "your cache class")
    L, B, M, Hkv, D, H = 2, 3, 8, 2, 4, 4
    gen = torch.Generator().manual_seed(0)
    with g.case(f"constructing cls({L}, {B}, {M}, {Hkv}, {D}, torch.float32, 'cpu')"):
        cache = cls(L, B, M, Hkv, D, torch.float32, "cpu")
    ref = ContiguousKVCache(L, B, M, Hkv, D, torch.float32, "cpu")
    for name in ("k", "v"):
        store = getattr(cache, name, None)
        expect(store is not None and len(store) == L,
               f"the cache should keep `{name}`: a list with one tensor per layer ({L} layers)")
        for layer in range(L):
            expect(tuple(store[layer].shape) == (B, M, Hkv, D),
                   f"cache.{name}[{layer}] should have shape [max_batch_size, max_len, num_kv_heads, "
                   f"head_dim] = {[B, M, Hkv, D]}, got {list(store[layer].shape)}")
    _fill_with_garbage(cache, ref, gen, H)

    steps = [([1], [0], 3),            # prefill row 1: 3 tokens
             ([0], [0], 5),            # prefill row 0: 5 tokens
             ([0, 1], [5, 3], 1),      # decode both rows, each at its own position
             ([2, 0], [0, 6], 2),      # rows out of order, two tokens each
             ([1], [4], 1)]            # decode one row alone
    for step in steps:
        rows, start, T = step
        N = len(rows) * T
        with g.case(f"calling set_step(rows={rows}, start={start}, num_tokens={T})"):
            cache.set_step(rows, start, T)
        ref.set_step(rows, start, T)
        for layer in range(L):
            q = torch.randn(N, H, D, generator=gen)
            k, v = torch.randn(N, Hkv, D, generator=gen), torch.randn(N, Hkv, D, generator=gen)
            with g.case(f"calling attend({layer}, q, k, v) after set_step(rows={rows}, start={start}, "
                        f"num_tokens={T})"):
                out = cache.attend(layer, q.clone(), k.clone(), v.clone())
            expected = ref.attend(layer, q, k, v)
            _check_writes(cache, ref, layer, step, k, v)
            _check_attention(cache, ref, out, expected, layer, step, q)

    model, tokenizer = tiny_model()
    prompts = ["Hi", "The capital of France is", "Once upon a time, in a small village by the sea, there lived"]
    params = SamplingParams(temperature=0, max_tokens=5)
    with g.case("running generate_static_batch(model, tokenizer, 3 prompts, cache_cls=cls)"):
        ours, _ = generate_static_batch(model, tokenizer, prompts, params, cache_cls=cls)
    reference, _ = generate_static_batch(model, tokenizer, prompts, params)
    for prompt, a, b in zip(prompts, ours, reference):
        if a.token_ids != b.token_ids and not greedy_tie(model, tokenizer.encode(prompt), a.token_ids, b.token_ids):
            raise AssertionError(f"generate_static_batch with your cache gives {a.token_ids} for {prompt!r}, "
                                 f"the reference cache {b.token_ids}: the unit cases pass, so look at "
                                 "for_model (sizes from model.config) and at set_step's positions")
    return g.passed()
