"""Lesson 13's delta grader, `check_lora_delta`: the learner's batched LoRA delta
`lora_delta(x, A, B, scale, slot_of_row)` for a mixed batch, like the package's
`minillm.lora.batched_delta.gathered_delta`.

    x [T, in]   A [slots, r, in]   B [slots, out, r]   scale [slots]   slot_of_row [T], -1 = base
    -> [T, out] float32: row t gets scale[s] * B[s] @ (A[s] @ x[t]) with s = slot_of_row[t], zeros when s < 0

A wrong delta never crashes the engine: it serves a request with another tenant's weights, or
the base model with an adapter, or an adapter at the wrong strength. So each planted case
isolates one rule, and a failure says which slot's delta (or which scale) a row got instead.
"""
from __future__ import annotations

import torch

from .harness import Grader, expect, grader


def _want(x, A, B, scale, slots) -> torch.Tensor:
    """The definition, row by row, in float64."""
    out = torch.zeros(x.shape[0], B.shape[1], dtype=torch.float64)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            out[t] = scale[s].double() * (B[s].double() @ (A[s].double() @ x[t].double()))
    return out


def _close(got, want) -> bool:
    return torch.allclose(got.double(), want, rtol=1e-4, atol=1e-5)


def _problem(x, A, B, scale, slots, got) -> str:
    """Which rule the first wrong row broke, read off the deltas it could have got instead."""
    scale64 = scale.double()
    for t, s in enumerate(slots.tolist()):
        row, xs = got[t].double(), x[t].double()
        unscaled = [B[j].double() @ (A[j].double() @ xs) for j in range(A.shape[0])]
        want = torch.zeros_like(row) if s < 0 else scale64[s] * unscaled[s]
        if torch.allclose(row, want, rtol=1e-4, atol=1e-5):
            continue
        here = f"row {t} (slot_of_row[{t}] = {s})"
        if s < 0:
            for j in range(A.shape[0]):
                if torch.allclose(row, scale64[j] * unscaled[j], rtol=1e-4, atol=1e-5) or \
                        torch.allclose(row, unscaled[j], rtol=1e-4, atol=1e-5):
                    how = ("A[-1] is the last slot in Python" if j == A.shape[0] - 1 else
                           "clamping -1 to 0 gathers slot 0" if j == 0 else "")
                    return (f"{here} is a base-model row, but its delta is slot {j}'s adapter"
                            f"{' (' + how + ')' if how else ''}: -1 means no adapter, so its delta is zeros "
                            "(gather some slot to keep the batch in one op if you like, then zero that row's scale)")
            return f"{here} is a base-model row: its delta must be zeros (the base model adds nothing)"
        if torch.allclose(row, unscaled[s], rtol=1e-4, atol=1e-5):
            return (f"{here}: your delta is B @ (A @ x) without the scaling: multiply by scale[slot] "
                    "(lora_alpha / r, rsLoRA: lora_alpha / sqrt(r)), the adapter's strength")
        for j in range(A.shape[0]):
            if j != s and torch.allclose(row, scale64[s] * unscaled[j], rtol=1e-4, atol=1e-5):
                return (f"{here} got slot {j}'s adapter: each row takes A and B of its own slot, "
                        f"slot_of_row[{t}], never another row's or the row index")
            if j != s and torch.allclose(row, scale64[j] * unscaled[s], rtol=1e-4, atol=1e-5):
                return (f"{here} has slot {s}'s A and B but slot {j}'s scale: each slot has its own "
                        f"scale, scale[slot_of_row[{t}]]")
            if torch.allclose(row, scale64[j] * unscaled[j], rtol=1e-4, atol=1e-5):
                return (f"{here} got slot {j}'s adapter: each row takes A and B of its own slot, "
                        f"slot_of_row[{t}], never another row's or the row index")
        return (f"{here}: expected scale[{s}] * B[{s}] @ (A[{s}] @ x[{t}]), got {row[:4].tolist()} ... "
                f"instead of {want[:4].tolist()} ...: A[s] is [r, in] (A @ x shrinks to r numbers), B[s] is "
                "[out, r] (B @ that grows back to out)")
    return "the delta differs from scale[s] * B[s] @ (A[s] @ x) somewhere"


def _case(g, fn, x, A, B, scale, slots, rule: str):
    call = f"lora_delta(x {list(x.shape)} {str(x.dtype).replace('torch.', '')}, A {list(A.shape)}, " \
           f"B {list(B.shape)}, scale {scale.tolist()}, slot_of_row {slots.tolist()})"
    inputs = [x.clone(), A.clone(), B.clone(), scale.clone(), slots.clone()]
    with g.case(f"calling {call}"):
        got = fn(x, A, B, scale, slots)
    for name, before, after in zip(("x", "A", "B", "scale", "slot_of_row"), inputs, (x, A, B, scale, slots)):
        expect(torch.equal(before, after), f"{call} changed its {name}: the delta only reads its inputs "
                                           "(A and B are the engine's slots, shared by every step)")
    expect(isinstance(got, torch.Tensor), f"{call} returned {type(got).__name__}: return a torch.Tensor")
    T, out = x.shape[0], B.shape[1]
    expect(tuple(got.shape) == (T, out),
           f"{call} returned shape {list(got.shape)}, expected [{T}, {out}]: one delta row (out features) per "
           "input row")
    expect(got.dtype == torch.float32, f"{call} returned {got.dtype}: compute the delta in float32 whatever x's "
                                       "dtype (x.float()); the engine casts it when adding to the output")
    want = _want(x, A, B, scale, slots)
    if not _close(got, want):
        raise AssertionError(f"{rule}: {call}\n    Hint: {_problem(x, A, B, scale, slots, got)}")


def _slots(g, n, r, d_in, d_out, scales):
    A = torch.randn(n, r, d_in, generator=g)
    B = torch.randn(n, d_out, r, generator=g)
    return A, B, torch.tensor(scales, dtype=torch.float32)


@grader
def check_lora_delta(fn) -> bool:
    """fn(x, A, B, scale, slot_of_row) -> [T, out] float32, like
    `minillm.lora.batched_delta.gathered_delta`: planted cases (one adapter, a base row, rows of
    several slots in any order, a scale per slot, zero-padded ranks, half-precision x), then random
    mixed batches."""
    g = Grader("check_lora_delta", "your lora_delta")
    expect(callable(fn), f"check_lora_delta takes your function lora_delta, got {fn!r}")
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(1, 6, generator=gen)
    A, B, scale = _slots(gen, 1, 2, 6, 5, [2.0])
    _case(g, fn, x, A, B, scale, torch.tensor([0]), "one row, one adapter (scale 2.0 = lora_alpha / r)")
    A, B, scale = _slots(gen, 2, 2, 6, 5, [1.5, 0.5])
    x = torch.randn(3, 6, generator=gen)
    _case(g, fn, x, A, B, scale, torch.tensor([-1, 0, -1]), "base-model rows (slot -1) between adapter rows")
    _case(g, fn, x, A, B, scale, torch.tensor([-1, 1, 1]), "base-model rows (slot -1) with slot 1")
    A, B, scale = _slots(gen, 3, 3, 6, 4, [1.0, 1.0, 1.0])
    x = torch.randn(6, 6, generator=gen)
    _case(g, fn, x, A, B, scale, torch.tensor([2, 0, 1, 0, -1, 2]), "each row its own slot, in any order")
    A, B, scale = _slots(gen, 3, 3, 6, 4, [0.5, 4.0, 2.0])
    _case(g, fn, x, A, B, scale, torch.tensor([1, 1, 0, 2, -1, 0]), "each slot its own scale")
    A[1, 2:] = 0.0                                  # slot 1 holds a rank-2 adapter in rank-3 slots
    B[1, :, 2:] = 0.0
    _case(g, fn, x, A, B, scale, torch.tensor([1, 0, 1, -1, 2, 1]), "a smaller rank, zero-padded in its slot")
    _case(g, fn, x.to(torch.bfloat16), A, B, scale, torch.tensor([0, 1, -1, 2, 2, 0]),
          "x in bfloat16 (a GPU engine's activations), A and B in float32")
    _case(g, fn, x, A, B, scale, torch.tensor([-1] * 6), "a batch of base-model rows only")
    for _ in range(30):
        n, r = int(torch.randint(1, 5, (1,), generator=gen)), int(torch.randint(1, 9, (1,), generator=gen))
        d_in, d_out, T = (int(v) for v in torch.randint(1, 24, (3,), generator=gen))
        A, B, _ = _slots(gen, n, r, d_in, d_out, [0.0] * n)
        scale = torch.rand(n, generator=gen) * 4
        x = torch.randn(T, d_in, generator=gen)
        slots = torch.randint(-1, n, (T,), generator=gen)
        _case(g, fn, x, A, B, scale, slots, "a random mixed batch")
    return g.passed()
