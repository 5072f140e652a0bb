"""The router's state and its two policies: which replicas are up, how many requests each
is serving, and (cache-aware) what prompts each was sent.

    round-robin   the next replica that is up, in turn: even load, blind to the caches
    cache-aware   the replica whose prefix tree holds the longest prefix of the prompt,
                  within a load bound (choice.py), as SGLang's router and llm-d do

`route` and `done` may be called from any thread (the app runs `route` in a worker thread:
hashing a long prompt is CPU work the event loop should not do), so one lock guards the state.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from .choice import DEFAULT_LOAD_BOUND, choose_replica
from .prefix_tree import MAX_CHUNKS, PrefixTree, chunk_keys

POLICIES = ("cache-aware", "round-robin")


class NoReplica(Exception):
    """Every replica is down."""


@dataclass
class Route:
    replica: int                  # the replica's index
    matched_chars: int            # how much of the prompt the router believes is cached there
    prompt_chars: int


class Router:
    def __init__(self, num_replicas: int, policy: str = "cache-aware", load_bound: int = DEFAULT_LOAD_BOUND,
                 max_chunks: int = MAX_CHUNKS, choose=choose_replica):
        """`choose(match_lengths, in_flight, load_bound) -> index`: the cache-aware decision
        (choice.py; lesson 10 passes the learner's)."""
        if policy not in POLICIES:
            raise ValueError(f"router policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        if num_replicas < 1 or load_bound < 0:
            raise ValueError("a router needs at least one replica and a load bound >= 0")
        self.policy, self.load_bound, self.choose = policy, load_bound, choose
        self.up = [True] * num_replicas
        self.in_flight = [0] * num_replicas
        self.routed = [0] * num_replicas                # requests sent to each, ever
        self.trees = [PrefixTree(max_chunks) for _ in range(num_replicas)]
        self._next = 0                                  # round-robin's turn
        self._lock = threading.Lock()

    def route(self, text: str | None, exclude: frozenset = frozenset()) -> Route:
        """Pick a replica that is up (and not in `exclude`) for a prompt; count it in flight
        until `done`. Raises NoReplica when none is left."""
        keys = chunk_keys(text) if text and self.policy == "cache-aware" else []
        with self._lock:
            candidates = [i for i, up in enumerate(self.up) if up and i not in exclude]
            if not candidates:
                raise NoReplica("no replica is available")
            if self.policy == "round-robin":
                i = self._round_robin(candidates)
                matched = 0
            else:
                matches = [self.trees[i].match(keys) for i in candidates]
                k = self.choose(matches, [self.in_flight[i] for i in candidates], self.load_bound)
                i, matched = candidates[k], matches[k]
                self.trees[i].insert(keys)
            self.in_flight[i] += 1
            self.routed[i] += 1
        return Route(i, matched, len(text or ""))

    def _round_robin(self, candidates: list[int]) -> int:
        n = len(self.up)
        for step in range(n):
            i = (self._next + step) % n
            if i in candidates:
                self._next = (i + 1) % n
                return i
        raise AssertionError("unreachable: candidates is not empty")

    def done(self, replica: int) -> None:
        with self._lock:
            self.in_flight[replica] -= 1

    def any_up(self) -> int:
        """The first replica that is up (for what any replica answers alike: /v1/models)."""
        with self._lock:
            for i, up in enumerate(self.up):
                if up:
                    return i
        raise NoReplica("no replica is available")

    def set_up(self, replica: int, up: bool) -> bool:
        """Take a replica out of rotation (or back in); True if that changed anything."""
        with self._lock:
            changed, self.up[replica] = self.up[replica] != up, up
        return changed

    def forget(self, replica: int) -> None:
        """A replica restarted or died: whatever it had cached is gone."""
        with self._lock:
            self.trees[replica] = PrefixTree(self.trees[replica].max_chunks)
