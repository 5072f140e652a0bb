"""One batch, many adapters: each row adds its own adapter's low-rank update.

A step's flat batch mixes rows of requests for different adapters (and for none). The base
weight W is shared, so `W x` runs once for the whole batch, as without LoRA. What differs per
row is the update s * B (A x), and A and B are tiny (rank r, a few dozen, against thousands of
columns), so it pays to keep every active adapter's A and B stacked in "slots"

    A [slots, r, in]   B [slots, out, r]   scale [slots]      slot_of_row [T], -1 = the base model

and gather by the row's slot. That is Punica's idea (BGMV: a batched gather-matmul-vector for
decode; SGMV: the same over segments of rows that share an adapter, for prefill). Here as torch
ops, two ways that give the same numbers:

  - `grouped_delta` (SGMV-like): the rows of each slot are gathered and run as two small
    matmuls, one pair per adapter present in the batch: few, fat calls;
  - `gathered_delta` (BGMV-like): every row gathers its own A and B ([T, r, in], [T, out, r])
    and one torch.bmm runs them all: one call, but T copies of the adapter weights.

The delta is computed in float32 whatever the activations' dtype (it is small; the base GEMM
is the work), and ranks smaller than the slots' r are zero-padded: zero rows of A and zero
columns of B add nothing.

`LoRALinear` asks `row_deltas`, which runs `grouped_delta`, or, inside `with plugged_delta(fn)`,
a function of `gathered_delta`'s signature: lesson 13 runs the learner's delta in the real
engine that way (process-wide while the block runs: a lesson's seam, not a serving option).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

_plugged = None          # the delta `plugged_delta` put in place of grouped_delta, while its block runs


def grouped_delta(x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, scale: torch.Tensor,
                  slot_of_row: torch.Tensor, slots_present: list[int] | None = None) -> torch.Tensor:
    """s[slot] * B[slot] @ (A[slot] @ x_row) for every row with slot >= 0, zeros for the others.
    x [T, in] -> [T, out]. `slots_present`: the distinct slots >= 0 in slot_of_row, if known."""
    out = x.new_zeros(x.shape[0], B.shape[1], dtype=torch.float32)
    if slots_present is None:
        slots_present = [int(s) for s in torch.unique(slot_of_row) if s >= 0]
    for s in slots_present:
        rows = (slot_of_row == s).nonzero().squeeze(1)
        xs = x.index_select(0, rows).float()
        out.index_copy_(0, rows, ((xs @ A[s].t()) @ B[s].t()) * scale[s])
    return out


def gathered_delta(x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, scale: torch.Tensor,
                   slot_of_row: torch.Tensor) -> torch.Tensor:
    """The same as grouped_delta in one torch.bmm over per-row gathered A and B (base rows: zero scale)."""
    idx = slot_of_row.clamp(min=0)
    a, b = A.index_select(0, idx), B.index_select(0, idx)                  # [T, r, in], [T, out, r]
    s = torch.where(slot_of_row >= 0, scale.index_select(0, idx), scale.new_zeros(()))
    shrunk = torch.bmm(a, x.float().unsqueeze(2))                          # [T, r, 1]
    return torch.bmm(b, shrunk).squeeze(2) * s.unsqueeze(1)


def row_deltas(x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, scale: torch.Tensor,
               slot_of_row: torch.Tensor, slots_present: list[int]) -> torch.Tensor:
    """What every LoRALinear computes its rows' deltas with: grouped_delta, or the plugged one."""
    if _plugged is not None:
        return _plugged(x, A, B, scale, slot_of_row)
    return grouped_delta(x, A, B, scale, slot_of_row, slots_present)


@contextmanager
def plugged_delta(fn):
    """While the block runs, every LoRALinear uses fn(x, A, B, scale, slot_of_row) -> [T, out]
    (gathered_delta's signature) for its rows' deltas: lesson 13 plugs the learner's in."""
    global _plugged
    if not callable(fn):
        raise TypeError(f"plugged_delta takes a function (x, A, B, scale, slot_of_row) -> delta, got {fn!r:.80}")
    before, _plugged = _plugged, fn
    try:
        yield fn
    finally:
        _plugged = before
