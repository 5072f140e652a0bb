"""Lessons 03-04: the block-map stepper. Record the KV memory after every engine step, then drag a
slider (or press play) to watch blocks being taken, shared, copied, cached and freed.

    from minillm.viz.block_stepper import BlockStepper, record_blocks

    snapshots = record_blocks(engine)        # engine.step() until every request is done
    BlockStepper(snapshots)

To add requests mid-run, record a few steps, add them, and pass the list back in:
`record_blocks(engine, snapshots, steps=3)`, `engine.add_request(...)`, `record_blocks(engine, snapshots)`.
The picture is `minillm.viz.memory.draw_memory`: block tables left, the pool right, each sequence
in one color for the whole run, ×n on a block held n times, gray for a free block that still
holds a cached prefix, white for a free empty one.
"""
from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as widgets

from minillm.viz.memory import _cached_free_blocks, draw_memory, owner_colors, running_sequences
from minillm.viz.widgets import PictureWidget


@dataclass
class BlockSnapshot:
    """The KV memory after one engine step: what `draw_memory` needs, copied."""
    tables: dict[str, list[int]]       # sequence name -> its block table
    seq_lens: dict[str, int]           # tokens whose K/V are stored
    ref_counts: list[int]
    cached: list[int]                  # free blocks that still hold a cached prefix
    num_blocks: int
    block_size: int
    finished: list[str]                # requests that finished in this step

    @property
    def num_used(self) -> int:
        return sum(1 for r in self.ref_counts if r)


def snapshot(engine, finished=()) -> BlockSnapshot:
    """Copy an engine's KV memory now (running sequences, reference counts, cached blocks)."""
    bm, seqs = engine.block_manager, running_sequences(engine)
    return BlockSnapshot({n: list(s.block_table) for n, s in seqs.items()},
                         {n: s.num_computed_tokens for n, s in seqs.items()}, list(bm.allocator.ref_counts),
                         _cached_free_blocks(bm), bm.allocator.num_blocks, bm.block_size, list(finished))


def record_blocks(engine, snapshots: list | None = None, steps: int | None = None) -> list[BlockSnapshot]:
    """Step the engine `steps` times, or until it has no unfinished request (the default), with a
    snapshot after every step. Pass `snapshots` to append to an earlier recording."""
    snapshots = snapshots if snapshots is not None else []
    while engine.has_unfinished_requests() and (steps is None or steps > 0):
        outputs = engine.step()
        snapshots.append(snapshot(engine, [o.request_id for o in outputs if o.finished]))
        steps = None if steps is None else steps - 1
    return snapshots


class BlockStepper(PictureWidget):
    def __init__(self, snapshots: list[BlockSnapshot], cols: int = 16, step: int = 0):
        if not snapshots:
            raise ValueError("no snapshots: record some engine steps first (record_blocks)")
        self.snapshots, self.cols = snapshots, cols
        names = dict.fromkeys(n for s in snapshots for n in s.tables)
        self.colors = owner_colors(names)                                   # one color per sequence, whole run
        self.step = widgets.IntSlider(step, min=0, max=len(snapshots) - 1, description="engine step",
                                      continuous_update=False)
        self.play = widgets.Play(step, min=0, max=len(snapshots) - 1, interval=700, description="play")
        widgets.jslink((self.play, "value"), (self.step, "value"))            # the browser moves the slider
        super().__init__([self.play, self.step], watched=[self.step])
        self.redraw()

    def draw(self):
        s = self.snapshots[self.step.value]
        fig = draw_memory(s.tables, s.num_blocks, seq_lens=s.seq_lens, block_size=s.block_size,
                          ref_counts=s.ref_counts, cached=s.cached, cols=self.cols, colors=self.colors,
                          title=f"after engine step {self.step.value}")
        shared = sum(1 for r in s.ref_counts if r > 1)
        free = s.num_blocks - s.num_used
        caption = (f"step {self.step.value}: <b>{s.num_used}</b> blocks in use ({shared} shared), "
                   f"<b>{free}</b> free, {len(s.cached)} of them still caching a prefix; running: "
                   f"{', '.join(s.tables) or 'nobody'}"
                   + (f"; finished in this step: {', '.join(s.finished)}" if s.finished else ""))
        return fig, caption
