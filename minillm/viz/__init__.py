"""Matplotlib pictures used by the lessons, and the widgets that replay them.

    minillm.viz.memory               lessons 03-04: block tables and the physical KV block pool
    minillm.viz.scheduling           lessons 05-06: what the scheduler runs, step by step
    minillm.viz.sampling_playground  lesson 01 widget: temperature / top-k / top-p sliders
    minillm.viz.block_stepper        lessons 03-04 widget: the block map at every recorded engine step
    minillm.viz.scheduler_player     lessons 05-06 widget: queues, token budget and preemptions per step
    minillm.viz.widgets              what the widgets share (and their static PNG fallback)
"""
