"""Matplotlib pictures used by the lessons.

    minillm.viz.memory       lessons 03-04: block tables and the physical KV block pool
    minillm.viz.scheduling   lessons 05-06: what the scheduler runs, step by step
"""
