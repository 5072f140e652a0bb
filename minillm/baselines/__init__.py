"""Lessons 01-02 and 05: the loops the engine replaces, kept to measure against.

    naive_generation.py   lesson 01: recompute the whole sequence for every token
    static_batching.py    lessons 02 and 05: a padded batch with a contiguous cache, run to the end
"""
