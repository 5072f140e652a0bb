"""Lesson 04's prefix-sharing graders: `check_block_hash` (deterministic, order-sensitive
hashes chained through the parent, so that equal hashes mean equal whole prefixes) and
`check_prefix_cache` (the longest cached run, first writer wins, forget), the cache then
run in the engine. A wrong hash or lookup does not crash: it silently serves one
prompt's KV to another, so the graders probe exactly those cases.
"""
from __future__ import annotations

import builtins
import inspect
import os
import subprocess
import sys
import textwrap

from .engine_runs import (AMPLE_POOL, GREEDY, PROMPTS, SMALL_POOL, compare_runs, drive, make_engine,
                          reference_run)
from .harness import Grader, expect, tiny_model, grader


# ---------------------------------------------------------------- lesson 04: block hash

_CHAINS = [[[1, 2, 3, 4]], [[1, 2, 3, 4], [5, 6, 7, 8]], [[9, 9, 9, 9], [5, 6, 7, 8]]]

# Runs the learner's function (its source) in a fresh interpreter and prints its hashes.
_FRESH = """
import hashlib, struct, json, pickle, sys, zlib
from typing import Optional
def _chain(fn, blocks):
    out, parent = [], None
    for block in blocks:
        parent = fn(parent, list(block))
        out.append(parent)
    return out
exec(compile(sys.stdin.read(), "<your block_hash>", "exec"))
print(repr([_chain({name}, c) for c in {chains!r}]))
"""


def _uses_builtin_hash(fn) -> bool:
    """True when fn's code (nested code included) calls the global name `hash` and that is
    Python's built-in, which salts str and bytes hashes differently in every process."""
    if fn.__globals__.get("hash", builtins.hash) is not builtins.hash:
        return False
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        if "hash" in code.co_names:
            return True
        codes.extend(c for c in code.co_consts if inspect.iscode(c))
    return False


def _hashes_in_a_fresh_process(fn):
    """The hashes of `_CHAINS` computed by fn's source in a new Python whose PYTHONHASHSEED
    differs from this one's; None when fn cannot run there alone (it needs the notebook's
    other globals), so nothing can be concluded. Graded from outside the sandbox, that Python
    is a sandbox of its own (`fn.fresh_python`, course/outside_help.py), never the grader's."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    python = getattr(fn, "fresh_python", None) or _fresh_python
    return python(_FRESH.format(name=fn.__name__, chains=_CHAINS), source)


def _fresh_python(script: str, source: str) -> str | None:
    seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    env = dict(os.environ, PYTHONHASHSEED=seed)
    try:
        out = subprocess.run([sys.executable, "-c", script], input=source, env=env, capture_output=True,
                             text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@grader
def check_block_hash(fn) -> bool:
    """fn(parent, token_ids) -> hash, like `kv.prefix_cache.block_hash` (parent is None for a
    prompt's first block, else the previous block's hash).

    Checks the hash is hashable and deterministic (equal lists, fresh objects, same
    hash), depends on every token and their order, on where the numbers split
    ([1, 23] vs [12, 3]), and on the parent: the same tokens after a different prefix
    (or as a first block) hash differently, so two prompts that share block 1 but not
    block 0 share no hash.
    """
    g = Grader("check_block_hash", "block_hash")

    def chain(blocks):
        hashes, parent = [], None
        for block in blocks:
            with g.case(f"hashing block {block} after parent {'None' if parent is None else 'hash'}"):
                parent = fn(parent, list(block))
            hashes.append(parent)
        return hashes

    first = chain([[1, 2, 3, 4]])[0]
    with g.case("using the hash as a dict key"):
        {first: 0}
    expect(first is not None, "block_hash returned None: return a hash (bytes from hashlib, or an int)")
    expect(chain([[1, 2, 3, 4]])[0] == first,
           "block_hash(None, [1, 2, 3, 4]) gave different hashes for two equal lists: hash the token "
           "values, never id() or a random salt")
    distinct = {
        "[1, 2, 3, 4] and [1, 2, 3, 5]": ([1, 2, 3, 4], [1, 2, 3, 5]),
        "[1, 2, 3, 4] and [2, 1, 3, 4] (the order matters)": ([1, 2, 3, 4], [2, 1, 3, 4]),
        "[1, 23] and [12, 3] (don't glue the digits into one string)": ([1, 23], [12, 3]),
    }
    for label, (u, v) in distinct.items():
        hu, hv = chain([u])[0], chain([v])[0]
        expect(hu != hv, f"block_hash(None, ...) gave the same hash for {label}: hash every token id, in order")
    a = chain([[1, 2, 3, 4], [5, 6, 7, 8]])
    b = chain([[9, 9, 9, 9], [5, 6, 7, 8]])
    expect(a[1] != b[1],
           "two prompts that share block 1 ([5, 6, 7, 8]) but not block 0 got the same hash for block 1: the "
           "hash must include the parent (the previous block's hash), so equal hashes mean equal whole "
           "prefixes; block 1's keys were computed attending to block 0")
    lone = chain([[5, 6, 7, 8]])[0]
    expect(lone != a[1], "block_hash(None, [5, 6, 7, 8]) equals the hash of the same tokens as block 1 after "
                         "[1, 2, 3, 4]: a first block (parent None) and a later block must differ")
    salted = ("block_hash uses Python's built-in hash(), which is salted: str and bytes hash "
              "differently in every process (PYTHONHASHSEED), so a cache shared or saved across "
              "processes would never hit. Use hashlib (e.g. sha256 over the parent and the token ids)")
    expect(not _uses_builtin_hash(fn), salted)
    fresh = _hashes_in_a_fresh_process(fn)
    if fresh is not None:
        here = repr([chain(c) for c in _CHAINS])
        expect(fresh == here, "block_hash gave other hashes for the same blocks in a fresh Python process "
                              "(another PYTHONHASHSEED): a block's name must be the same in every process. "
                              "Hash the token ids with hashlib, never hash(), id() or a random salt")
    return g.passed()


# ---------------------------------------------------------------- lesson 04: prefix cache

@grader
def check_prefix_cache(cls) -> bool:
    """cls(), like `kv.prefix_cache.PrefixCache`: lookup(block_hashes) -> block ids,
    insert(hash, block), forget(block), record(num_prompt_tokens, num_cached_tokens),
    and the `hit_rate` property.

    Checks lookup returns the longest cached run from the first hash (stopping at the
    first miss, so no block is used out of its prefix: prompts sharing block 1 but not
    block 0 get no hit), insert is first-writer-wins, forget drops a block's hash (and
    ignores blocks it never saw), and hit_rate = hits / queried tokens (0.0 before any).
    Then the engine with `prefix_cache_cls=cls` serves a second request with a shared
    prefix from the cache (num_cached_tokens as the reference's) with reference-identical
    greedy tokens, also on a small pool where cached blocks get evicted.
    """
    from ..kv.prefix_cache import block_hash

    g = Grader("check_prefix_cache", "your prefix cache")

    def chain(blocks):
        hashes, parent = [], None
        for block in blocks:
            parent = block_hash(parent, block)
            hashes.append(parent)
        return hashes

    A = chain([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    B = chain([[1, 2, 3, 4], [0, 0, 0, 0], [9, 10, 11, 12]])      # shares block 0 only
    C = chain([[4, 3, 2, 1], [5, 6, 7, 8]])                       # shares block 1's tokens, not block 0
    with g.case("constructing cls()"):
        c = cls()

    def lookup(hashes, label):
        with g.case(f"calling lookup({label})"):
            return [int(b) for b in c.lookup(list(hashes))]

    expect(lookup(A, "3 hashes on an empty cache") == [], "lookup on an empty cache should return []")
    with g.case("inserting prompt A's 3 block hashes as blocks 5, 2, 7"):
        for h, b in zip(A, (5, 2, 7)):
            c.insert(h, b)
    for n in (3, 2, 0):
        got = lookup(A[:n], f"A's first {n} hashes")
        expect(got == [5, 2, 7][:n], f"after inserting A's hashes as blocks [5, 2, 7], lookup of A's first {n} "
                                     f"hashes should return {[5, 2, 7][:n]}, got {got}")
    got = lookup(B, "B's hashes (B shares only block 0 with A)")
    expect(got == [5], f"lookup of a prompt sharing only block 0 with A should return [5], got {got}: stop at "
                       "the first hash that is not cached")
    got = lookup(C, "C's hashes (C shares block 1's tokens with A, but not block 0)")
    expect(got == [], f"lookup of a prompt that shares block 1's tokens but not block 0 with A returned {got}: "
                      "a block is reused only after its whole prefix; stop at the first miss")
    with g.case("inserting A's first hash again as block 9"):
        c.insert(A[0], 9)
    got = lookup(A, "A's hashes")
    expect(got == [5, 2, 7], f"insert is first-writer-wins: A's first block is already cached as block 5, so "
                             f"insert(hash, 9) must not replace it; lookup(A) should stay [5, 2, 7], got {got}")
    with g.case("calling forget(2) (block 2 is being reused for other tokens)"):
        c.forget(2)
    got = lookup(A, "A's hashes after forget(2)")
    expect(got == [5], f"after forget(2), lookup(A) should return [5], got {got}. "
                       + ("forget(block) must drop that block's hash. " if 2 in got else "")
                       + ("lookup must stop at the first miss: block 7 is only valid after block 2's prefix"
                          if 7 in got else ""))
    with g.case("calling forget(11) for a block the cache never saw, and forget(2) again (the block manager "
                "calls forget on every block it hands out: ignore blocks that name no prefix)"):
        c.forget(11)
        c.forget(2)
    with g.case("inserting A's second hash as block 3, and a new hash as block 2"):
        c.insert(A[1], 3)
        other = block_hash(None, [42, 42, 42, 42])
        c.insert(other, 2)
    got = lookup(A, "A's hashes")
    expect(got == [5, 3, 7], f"after re-inserting A's second block as block 3, lookup(A) should be [5, 3, 7], "
                             f"got {got}")
    got = lookup([other], "the new hash")
    expect(got == [2], f"a forgotten block can name a new prefix: after insert(new hash, 2), lookup should "
                       f"return [2], got {got}")

    with g.case("reading hit_rate of a new cache, then record(12, 8) and record(4, 0)"):
        c2 = cls()
        empty = c2.hit_rate
        c2.record(12, 8)
        c2.record(4, 0)
        rate = c2.hit_rate
    expect(isinstance(empty, (int, float)) and empty == 0.0,
           f"hit_rate before any record() should be 0.0, got {empty!r}"
           + (": make hit_rate a @property" if callable(empty) else ""))
    expect(isinstance(rate, (int, float)) and abs(rate - 0.5) < 1e-9,
           f"after record(12, 8) and record(4, 0), hit_rate should be 8 / 16 = 0.5, got {rate!r}: "
           "cached tokens over prompt tokens, summed over all records")

    # the real engine
    model, tokenizer = tiny_model()
    long_ids = tokenizer.encode(PROMPTS[2])                      # 15 tokens: 3 full blocks of 4
    shared = [long_ids, long_ids[:12] + tokenizer.encode(" a cat"), long_ids[:8] + [400, 401, 402]]
    stuck = "lookup, insert and forget only map hashes to block ids; the allocator owns the blocks"
    engine = make_engine(g, "prefix_cache_cls=cls", prefix_cache_cls=cls, num_kv_blocks=32, block_size=4)
    first = drive(g, engine, shared[:1], GREEDY, "prefix_cache_cls=cls: the first prompt", stuck)
    rest = drive(g, engine, shared[1:], GREEDY, "prefix_cache_cls=cls: two prompts sharing its prefix", stuck)
    for prompt, out in zip(shared[1:], rest):
        common = next(i for i, (x, y) in enumerate(zip(prompt + [-1], long_ids + [-2])) if x != y)
        expected = min(common, len(prompt) - 1) // 4 * 4          # whole blocks, one token left to compute
        expect(out.num_cached_tokens == expected,
               f"LLMEngine(prefix_cache_cls=cls): a prompt sharing its first {expected} tokens (whole blocks) "
               f"with an earlier one should find them cached; num_cached_tokens is {out.num_cached_tokens}. "
               "Does lookup find the hashes insert stored, in order?")
    compare_runs(shared, first + rest, reference_run(shared, GREEDY, **AMPLE_POOL), "prefix_cache_cls=cls",
                 "a cached block must hold exactly the prefix its hash names")
    rate = engine.stats()["prefix_cache_hit_rate"]
    expect(rate > 0, f"LLMEngine(prefix_cache_cls=cls).stats() reports a hit rate of {rate} after cache hits: "
                     "record() must add up prompt and cached tokens")
    small = make_engine(g, "prefix_cache_cls=cls, num_kv_blocks=8", prefix_cache_cls=cls, **SMALL_POOL)
    ours = drive(g, small, PROMPTS, GREEDY, "prefix_cache_cls=cls, 8 blocks: 5 prompts", stuck)
    ours += drive(g, small, shared, GREEDY, "prefix_cache_cls=cls, 8 blocks: 3 prompts sharing a prefix", stuck)
    reference = reference_run(PROMPTS, GREEDY, **AMPLE_POOL) + reference_run(shared, GREEDY, **AMPLE_POOL)
    compare_runs(PROMPTS + shared, ours, reference,
                 "prefix_cache_cls=cls, 8 blocks (cached blocks get evicted and reused)",
                 "when a block is handed out for new tokens, forget(block) must drop its old hash, or a later "
                 "prompt reuses KV that was overwritten")
    return g.passed()
