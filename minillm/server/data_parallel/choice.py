"""The cache-aware routing decision, as one pure function (lesson 10's exercise).

Each replica keeps its own KV pool, so a prompt whose prefix a replica has seen is cheaper
there: its prefix cache skips that part of the prefill. Sending every request to the best
match would pile a popular system prompt's traffic onto one replica while the others idle,
so the match only wins while that replica is not too far ahead of the least loaded one
(SGLang's router and llm-d's endpoint picker make the same trade):

    best  = the replica with the longest matched prefix (ties: fewer in flight, then lower index)
    least = the replica with the fewest requests in flight (ties: lower index)
    best, unless in_flight[best] - in_flight[least] > load_bound: then least

With no match anywhere, every replica ties at 0, and the least loaded gets the request.
"""
from __future__ import annotations

DEFAULT_LOAD_BOUND = 8      # requests in flight a cache hit may be ahead of the least loaded replica


def choose_replica(match_lengths: list[int], in_flight: list[int], load_bound: int = DEFAULT_LOAD_BOUND) -> int:
    """The index of the replica that gets the request.

    match_lengths[i]: how long a prefix of the prompt replica i has (probably) cached;
    in_flight[i]: requests replica i is serving now; load_bound: how many more in flight than
    the least loaded replica the best match may have and still get it."""
    if not match_lengths or len(match_lengths) != len(in_flight):
        raise ValueError(f"one match length and one in-flight count per replica, got "
                         f"{len(match_lengths)} and {len(in_flight)}")
    replicas = range(len(match_lengths))
    least = min(replicas, key=lambda i: (in_flight[i], i))
    best = min(replicas, key=lambda i: (-match_lengths[i], in_flight[i], i))
    if in_flight[best] - in_flight[least] > load_bound:
        return least
    return best
