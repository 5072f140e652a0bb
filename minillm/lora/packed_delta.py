"""A faster batched delta: every slot and every sub-projection of a linear in a few calls.

`grouped_delta` (batched_delta.py) runs two small matmuls per (adapter in the batch,
sub-projection): with 16 adapters the fused q/k/v linear alone makes ~100 calls per step, and
30 layers of them cost more than the base model's own GEMMs at decode. Here the step's rows are
laid out once, by slot (`StepLayout`, shared by every linear of the model), and each linear adds
its delta with a handful of calls, whatever the number of adapters:

    x [T, in] ─gather─► [S, width, in] ─bmm A_t─► [S, width, K·r] ·scale ─bmm B_t[k], per sub─► [S, width, out]
                                                                     ─gather the real rows─► y[rows] +=

`width` is the fullest slot's row count (other slots are padded: their pad rows compute
garbage that is never gathered back). A_t stacks the linear's K sub-projections' A, transposed,
along the rank (q, k, v: one bmm shrinks for all three); each sub's B_t expands into its own
output columns. Both are stored the way bmm reads them: on CPU a bmm over a transposed view
took 10-30x longer than over a contiguous tensor (tiny shapes, a loaded machine: roughly).
A slot with more than `LONG_SLOT` rows (a prompt being prefilled) would pad every other slot
to its length, so it runs on its own: x_s @ A_t[s], then each B_t[k][s].

Slots between the first and last present one are in the block even if no row uses them
(their zero-row pad is cheaper than gathering the present slots' weights into a new tensor,
which at 16 adapters would copy all their A and B every call).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

LONG_SLOT = 32          # rows above which a slot runs alone, not padded into the block


@dataclass
class StepLayout:
    """Where each adapter row of a step goes. Built once per step (`build`), read by every linear."""
    lo: int                          # the block holds slots lo .. hi-1
    hi: int
    width: int                       # rows per slot in the block (0: no block)
    pad_index: torch.Tensor          # [(hi-lo) * width]: the x row at each block position (pads: row 0)
    rows: torch.Tensor               # the block's real rows, ascending ...
    positions: torch.Tensor          # ... and their positions in the block
    dense: bool                      # rows == 0..T-1: the delta adds to y without an index
    long: list[tuple[int, torch.Tensor]]     # (slot, its rows) for slots that run alone
    _scale: torch.Tensor | None = None       # scale[lo:hi] as [S, 1, 1], made by the step's first linear

    def block(self, t: torch.Tensor) -> torch.Tensor:
        """t's slots lo..hi-1 (t itself when that is every slot: one op fewer per call)."""
        return t if (self.lo, self.hi) == (0, t.shape[0]) else t[self.lo:self.hi]

    def scale_block(self, scale: torch.Tensor) -> torch.Tensor:
        if self._scale is None:
            self._scale = self.block(scale).view(-1, 1, 1)
        return self._scale

    @staticmethod
    def build(slot_of_row: list[int], device) -> "StepLayout | None":
        """The layout for a step whose row i uses slot slot_of_row[i] (-1: the base model)."""
        count: dict[int, int] = {}
        for s in slot_of_row:
            if s >= 0:
                count[s] = count.get(s, 0) + 1
        if not count:
            return None
        short = {s for s, n in count.items() if n <= LONG_SLOT}
        long_rows: dict[int, list[int]] = {s: [] for s in count if s not in short}
        lo, hi = (min(short), max(short) + 1) if short else (0, 0)
        width = max((count[s] for s in short), default=0)
        pad_index = [0] * ((hi - lo) * width)
        filled = dict.fromkeys(short, 0)
        rows, positions = [], []
        for i, s in enumerate(slot_of_row):
            if s in filled:
                p = (s - lo) * width + filled[s]
                filled[s] += 1
                pad_index[p] = i
                rows.append(i)
                positions.append(p)
            elif s >= 0:
                long_rows[s].append(i)

        def t(v):
            return torch.tensor(v, dtype=torch.long, device=device)
        return StepLayout(lo, hi, width, t(pad_index), t(rows), t(positions), len(rows) == len(slot_of_row),
                          [(s, t(r)) for s, r in sorted(long_rows.items())])


def packed_delta(x: torch.Tensor, y: torch.Tensor, A_t: torch.Tensor, Bs: list[torch.Tensor],
                 scale: torch.Tensor, layout: StepLayout) -> None:
    """Add s[slot] * B_k[slot] @ (A_k[slot] @ x_row) into y's columns of sub k, for every adapter
    row, in place. x [T, in], y [T, sum of outs]; A_t [slots, in, K*r] (sub k's A, transposed,
    in columns k*r..(k+1)*r), Bs[k] [slots, r, out_k] (B_k transposed), scale [slots]. In float32."""
    r = Bs[0].shape[1]
    xf = x if x.dtype == A_t.dtype else x.to(A_t.dtype)
    if layout.width:
        n, w = layout.hi - layout.lo, layout.width
        xs = xf.index_select(0, layout.pad_index).view(n, w, -1)
        shrunk = torch.bmm(xs, layout.block(A_t)).mul_(layout.scale_block(scale))              # [S, w, K r]
        parts = [torch.bmm(shrunk[:, :, k * r:(k + 1) * r] if len(Bs) > 1 else shrunk, layout.block(B))
                 for k, B in enumerate(Bs)]
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)                          # [S, w, out]
        delta = out.view(n * w, -1).index_select(0, layout.positions)
        delta = delta if delta.dtype == y.dtype else delta.to(y.dtype)
        if layout.dense:
            y += delta
        else:
            y.index_add_(0, layout.rows, delta)
    for s, rows in layout.long:
        shrunk = (xf.index_select(0, rows) @ A_t[s]).mul_(scale[s])
        out = torch.cat([shrunk[:, k * r:(k + 1) * r] @ B[s] for k, B in enumerate(Bs)], dim=1)
        y.index_add_(0, rows, out if out.dtype == y.dtype else out.to(y.dtype))
