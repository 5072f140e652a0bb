"""Lesson 10's simulated ranks: N ranks as N threads of one process, for `check_layer_sharding`.

`ThreadGroup` has the one collective a sharded decoder layer calls, `all_reduce`, with
torch.distributed's contract (every rank's tensor summed, the sum in place on every rank), and
records the shape of each tensor it was handed, so that the grader can say where a learner put
(or forgot) the all-reduce. The sum goes through a `threading.Barrier` with a timeout, so a rank
that skips a collective its peers reach makes them fail within seconds instead of hanging, as a
real group's timeout would.
"""
from __future__ import annotations

import threading

import torch

from .harness import expect

BARRIER_TIMEOUT_S = 10.0     # a rank waiting this long in an all-reduce for its peers: they never came


class _Shared:
    def __init__(self, n: int):
        self.n, self.slots = n, [None] * n
        self.barrier = threading.Barrier(n, timeout=BARRIER_TIMEOUT_S)


class ThreadGroup:
    """Rank `rank` of N ranks run as N threads of one process. `all_reduce(x)` puts the sum of
    every rank's x into x (in place, as torch.distributed does), summed in rank order so that
    every rank gets the same bits; `reduced` lists the shapes it was handed."""

    def __init__(self, rank: int, shared: _Shared):
        self.rank, self.world_size, self._shared = rank, shared.n, shared
        self.reduced: list[tuple[int, ...]] = []

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        s = self._shared
        self.reduced.append(tuple(x.shape))
        s.slots[self.rank] = x.detach().clone()
        s.barrier.wait()
        shapes = sorted({tuple(t.shape) for t in s.slots})
        if len(shapes) > 1:
            raise RuntimeError(f"the ranks handed one all-reduce tensors of different shapes {shapes}")
        total = s.slots[0].clone()
        for t in s.slots[1:]:
            total += t
        s.barrier.wait()
        x.copy_(total)
        return x


def ranks_of(n: int) -> list[ThreadGroup]:
    shared = _Shared(n)
    return [ThreadGroup(r, shared) for r in range(n)]


def run_ranks(work, n: int) -> list:
    """work(rank) on n threads at once; each rank's result (or the exception it raised)."""
    results: list = [None] * n

    def run(rank):
        try:
            with torch.no_grad():                       # grad mode is per thread
                results[rank] = work(rank)
        except BaseException as e:                      # handed back, judged by the caller
            results[rank] = e
    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * BARRIER_TIMEOUT_S)
    expect(not any(t.is_alive() for t in threads),
           "the ranks hung: a rank waits in a collective its peers never reach\n    Hint: every rank must run "
           "the same collectives in the same order (no `if rank == 0:` around an all-reduce)")
    return results
