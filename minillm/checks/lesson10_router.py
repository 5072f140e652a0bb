"""Lesson 10's routing grader, `check_router_choice`: the learner's cache-aware decision
`choose_replica(match_lengths, in_flight, load_bound) -> int`, as
`minillm.server.data_parallel.choice.choose_replica` makes it for the data-parallel front.

Planted workloads, each isolating one rule: the longest match wins; it still wins while it has
at most `load_bound` more requests in flight than the least loaded replica (more than the bound,
not as many, sends the request away), measured from the least loaded replica, not from zero;
past the bound the least loaded replica gets it, not the second-best match; equal matches go to
the replica with fewer in flight, then to the lowest index; no match anywhere is a tie at 0;
one replica always gets it; lists of different lengths are refused with a ValueError. Then 500
random workloads against the package's function. A wrong decision never crashes a server (every
replica answers correctly), it only loses cache hits or floods one replica, so each planted case
names the rule it broke.
"""
from __future__ import annotations

import operator
import random

from .harness import Grader, expect, grader

LONGEST = "The replica whose cache holds the longest prefix of the prompt gets it (largest match_lengths[i])"
BOUND = ("The best match loses the request only when in_flight[best] - in_flight[least] > load_bound: *more* than "
         "the bound, so exactly load_bound ahead still wins")
FROM_LEAST = ("The bound is measured from the least loaded replica: compare in_flight[best] - min(in_flight) with "
              "load_bound, not in_flight[best] alone")
TO_LEAST = ("Past the bound the request goes to the least loaded replica (fewest in flight, ties to the lowest "
            "index), not to the next-best match: the point is to relieve the flooded replica")
TIE_LOAD = ("Among replicas with the same match length, the one with fewer requests in flight wins: sort by "
            "(-match_lengths[i], in_flight[i], i)")
TIE_INDEX = ("A full tie (same match, same load) goes to the lowest index: min(range(n), key=lambda i: "
             "(-match_lengths[i], in_flight[i], i)), not max, and not the last one a loop saw")

# (the rule, match_lengths, in_flight, load_bound, expected, hint)
CASES = [
    ("the longest match wins", [0, 48, 16], [0, 0, 0], 8, 1, LONGEST),
    ("the longest match wins, wherever it is", [64, 0, 16], [0, 0, 0], 8, 0, LONGEST),
    ("equal matches: fewer in flight", [32, 32, 0], [3, 2, 0], 8, 1, TIE_LOAD),
    ("a full tie: the lowest index", [32, 32], [1, 1], 8, 0, TIE_INDEX),
    ("a full tie among three: the lowest index", [0, 16, 16], [4, 2, 2], 8, 1, TIE_INDEX),
    ("no match anywhere: the least loaded", [0, 0, 0], [2, 1, 1], 8, 1,
     "with no match, every replica ties at 0 and the least loaded gets the request (lowest index among "
     "equals). " + TIE_LOAD),
    ("a busier best match within the bound still wins", [0, 48, 16], [0, 3, 0], 4, 1,
     "replica 1 is 3 ahead of the least loaded, within load_bound 4: the cache hit is worth it. " + BOUND),
    ("exactly at the bound still wins", [0, 48, 16], [0, 4, 0], 4, 1, BOUND),
    ("the bound is counted from the least loaded", [0, 48, 16], [2, 6, 3], 4, 1, FROM_LEAST),
    ("past the bound: the least loaded", [0, 48, 16], [0, 5, 0], 4, 0,
     "replica 1 would be 5 ahead of the least loaded, more than load_bound 4. " + TO_LEAST),
    ("past the bound: the least loaded, not the next-best match", [0, 48, 16], [1, 6, 2], 4, 0, TO_LEAST),
    ("past the bound: the least loaded, wherever it is", [64, 0, 0], [9, 3, 1], 4, 2, TO_LEAST),
    ("a bound of 0: any load difference sends it away", [64, 0], [1, 0], 0, 1, BOUND),
    ("past the bound, least loaded tie: the lowest index", [80, 0, 0], [12, 2, 2], 3, 1, TIE_INDEX),
    ("one replica", [16], [40], 0, 0, "with one replica there is nothing to choose: return 0"),
]


def _call(g, fn, matches, in_flight, bound) -> int:
    call = f"choose_replica({matches}, {in_flight}, load_bound={bound})"
    m, f = list(matches), list(in_flight)
    with g.case(f"calling {call}"):
        got = fn(m, f, bound)
    expect(m == matches and f == in_flight,
           f"{call} changed its lists to {m}, {f}: the router keeps them, the decision only reads them")
    try:
        index = operator.index(got)
    except TypeError:
        raise AssertionError(f"{call} returned {got!r}: return the chosen replica's index, an int from 0 to "
                             f"{len(matches) - 1}") from None
    expect(0 <= index < len(matches), f"{call} returned {index}: return an index of the replicas, from 0 to "
                                      f"{len(matches) - 1} (not a match length, not a count)")
    return index


@grader
def check_router_choice(fn) -> bool:
    """fn(match_lengths, in_flight, load_bound) -> the replica's index: the longest match within
    the load bound, else the least loaded; like `minillm.server.data_parallel.choice.choose_replica`."""
    from ..server.data_parallel.choice import choose_replica
    g = Grader("check_router_choice", "your choose_replica")
    expect(callable(fn), f"check_router_choice takes your function choose_replica, got {fn!r}")
    for rule, matches, in_flight, bound, want, hint in CASES:
        got = _call(g, fn, matches, in_flight, bound)
        expect(got == want, f"{rule}: choose_replica({matches}, {in_flight}, load_bound={bound}) returned {got}, "
                            f"expected {want}\n    Hint: {hint}")
    for matches, in_flight in (([1, 2], [0]), ([], [])):
        call = f"choose_replica({matches}, {in_flight}, load_bound=1)"
        with g.case(f"calling {call}"):
            try:
                fn(matches, in_flight, 1)
            except ValueError:
                continue
        raise AssertionError(f"{call} did not raise ValueError\n    Hint: one match length and one in-flight "
                             "count per replica, at least one replica: refuse anything else with a ValueError "
                             "(a router bug should fail loudly, not route to a replica that does not exist)")
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 5)
        matches = [rng.choice([0, 0, 16, 32, 48, 64]) for _ in range(n)]
        in_flight = [rng.randint(0, 10) for _ in range(n)]
        bound = rng.randint(0, 6)
        got, want = _call(g, fn, matches, in_flight, bound), choose_replica(matches, in_flight, bound)
        expect(got == want, f"on a random workload, choose_replica({matches}, {in_flight}, load_bound={bound}) "
                            f"returned {got}, expected {want}\n    Hint: best = the longest match (ties: fewer in "
                            "flight, then the lower index); least = the fewest in flight (ties: the lower index); "
                            "best, unless in_flight[best] - in_flight[least] > load_bound")
    return g.passed()
