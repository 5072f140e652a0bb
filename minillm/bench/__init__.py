"""Benchmarks: ratios measured side by side in one process, never lone absolute times."""
