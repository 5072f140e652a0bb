"""Lesson 04: automatic prefix caching. Full blocks are named by the prefix they end.

A full block's hash is hash(parent block's hash, the block's token ids), so equal
hashes mean equal *whole prefixes*, not just equal blocks: block 3 of two requests
can be shared only if blocks 0-2 were equal too. A new request walks its prompt
block by block and reuses the longest chain of hashes that are cached.

The cache only maps hashes to block ids; the allocator owns the blocks. A cached
block whose reference count fell to zero stays in the map until the allocator
hands it out again (least recently used first), and `forget` drops it then.
"""
from __future__ import annotations

import hashlib
import struct


def block_hash(parent: bytes | None, token_ids: list[int]) -> bytes:
    """Content hash of a full block chained to its parent's hash (None for the first block).
    A cryptographic hash, so two different prefixes never collide in practice."""
    h = hashlib.sha256(parent or b"root")
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.digest()


def chain_root(seq) -> bytes | None:
    """The parent of a sequence's first block: None for the base model, else a hash of its LoRA
    adapter (lesson 13), so a prefix cached under one adapter is never reused under another or
    the base model: same tokens, other weights, other K/V."""
    lora = getattr(seq, "lora_request", None)
    return None if lora is None else hashlib.sha256(lora.cache_salt).digest()


class PrefixCache:
    def __init__(self):
        self.block_of: dict[bytes, int] = {}      # prefix hash -> block id
        self.hash_of: dict[int, bytes] = {}       # block id -> prefix hash
        self.queries = 0                          # prompt tokens looked up
        self.hits = 0                             # of which found cached

    def lookup(self, block_hashes: list[bytes]) -> list[int]:
        """Block ids of the longest cached run of `block_hashes`, from the first."""
        found = []
        for h in block_hashes:
            block = self.block_of.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def insert(self, h: bytes, block: int) -> None:
        """Remember that `block` holds the prefix named `h` (first writer wins)."""
        if h not in self.block_of and block not in self.hash_of:
            self.block_of[h] = block
            self.hash_of[block] = h

    def forget(self, block: int) -> None:
        """`block` is being reused for other tokens: it no longer names any prefix."""
        h = self.hash_of.pop(block, None)
        if h is not None:
            del self.block_of[h]

    def record(self, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        self.queries += num_prompt_tokens
        self.hits += num_cached_tokens

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0
