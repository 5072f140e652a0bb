"""The running sequences' block tables, kept as rows of one tensor from step to step.

A step's attention reads every sequence's block table as one padded [B, width] tensor. Built
afresh from the Python lists each step, that costs time that grows with the context (about
50 ns per block id: 0.3 ms a step for 64 sequences of 1,500 tokens), though a decode step
barely changes the tables: a sequence gains one block every block_size tokens. So each
sequence keeps a row here; a row is written again only when its table changed (compared as
lists, which Python does in C: a new block, a copy-on-write, a swap back in), and a step's
tensor is one gather of the rows it needs. Short tables (up to MIN_WIDTH blocks) are left to
PagedStep.build: converting them afresh costs no more than the bookkeeping here.
"""
from __future__ import annotations

import torch

MIN_WIDTH = 32           # blocks: 512 tokens of context at block_size 16


class BlockTableRows:
    def __init__(self, min_width: int = MIN_WIDTH):
        self.min_width = min_width
        self.rows = torch.zeros(0, 0, dtype=torch.long)      # [capacity, max width], 0-padded
        self.written: dict[int, tuple[int, list[int]]] = {}  # seq_id -> (its row, the table written there)

    def padded(self, seqs: list) -> torch.Tensor | None:
        """[len(seqs), the longest table] block ids, each table padded with 0 (what PagedStep.build
        makes of the lists), or None when no table is longer than min_width. Rows of sequences
        not in `seqs` are given to others."""
        width = max(len(s.block_table) for s in seqs)
        if width <= self.min_width:
            return None
        capacity, max_width = self.rows.shape
        if len(seqs) > capacity or width > max_width:       # grown by doubling; every row written again
            self.rows = torch.zeros(capacity if len(seqs) <= capacity else max(len(seqs), 2 * capacity),
                                    max_width if width <= max_width else max(width, 2 * max_width), dtype=torch.long)
            self.written = {}
        keys = [getattr(s, "seq_id", None) for s in seqs]     # a tensor-parallel rank gets new objects each step
        if None in keys or len(set(keys)) < len(keys):
            keys = [id(s) for s in seqs]
        kept = {key: self.written[key] for key in keys if key in self.written}
        taken = {row for row, _ in kept.values()}
        free = (row for row in range(self.rows.shape[0]) if row not in taken)
        self.written, index = {}, []
        for key, s in zip(keys, seqs):
            row, table = kept.get(key) or (next(free), None)
            if table != s.block_table:          # an id may be reused by another sequence: the contents decide
                table = list(s.block_table)
                self.rows[row] = torch.tensor(table + [0] * (self.rows.shape[1] - len(table)), dtype=torch.long)
            self.written[key] = (row, table)
            index.append(row)
        if index == list(range(len(index))):            # the batch in the order its rows were given
            return self.rows[:len(index), :width].clone(memory_format=torch.contiguous_format)
        return self.rows[:, :width].index_select(0, torch.tensor(index))
