"""Lessons 03-04: which blocks each sequence holds, with prefix sharing and copy-on-write.

The verbs the scheduler uses:
  can_allocate / allocate   give a new sequence blocks for its prompt, reusing cached prefix blocks
  num_tokens_to_compute     what a new sequence would still feed after its cached prefix
  can_append / append_slots make room for the tokens a step will write, copying shared blocks first
  fork                      a child sequence shares all its parent's blocks (n > 1 sampling)
  free                      give a sequence's blocks back (full ones stay cached for reuse)
  swap_out / swap_in        move a preempted sequence's blocks to CPU memory and back (lesson 06)

Invariant: a block's reference count equals the number of block tables that hold it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..utils import cdiv
from .block_allocator import BlockAllocator
from .prefix_cache import PrefixCache, block_hash, chain_root


@dataclass
class BlockOps:
    """Moves the KV cache must make before the next forward, as (src, dst) block pairs."""
    swap_out: list[tuple[int, int]] = field(default_factory=list)   # device -> CPU
    swap_in: list[tuple[int, int]] = field(default_factory=list)    # CPU -> device
    copies: list[tuple[int, int]] = field(default_factory=list)     # device -> device (copy-on-write)



class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 num_cpu_blocks: int = 0, allocator_cls=BlockAllocator, prefix_cache_cls=PrefixCache):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.allocator = allocator_cls(num_blocks)
        self.prefix_cache = prefix_cache_cls() if enable_prefix_caching else None
        self.cpu_allocator = BlockAllocator(num_cpu_blocks) if num_cpu_blocks else None
        self.ops = BlockOps()
        self.num_cow_copies = 0
        self.num_swapped_out_blocks = 0
        self.num_swapped_in_blocks = 0

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    # -- new sequences ---------------------------------------------------------------
    def _prompt_hashes(self, token_ids: list[int], root: bytes | None = None) -> list[bytes]:
        hashes, parent = [], root
        for i in range(len(token_ids) // self.block_size):
            parent = block_hash(parent, token_ids[i * self.block_size:(i + 1) * self.block_size])
            hashes.append(parent)
        return hashes

    def chain_root(self, seq) -> bytes | None:
        """The parent of the sequence's first block: its LoRA adapter's hash, None for the base
        model (kv/prefix_cache.py). Lesson 13's subclass plugs the learner's in here."""
        return chain_root(seq)

    def _cached_prefix(self, seq) -> tuple[list[bytes], list[int]]:
        """Hashes of the sequence's full blocks and the cached blocks it can reuse. At
        least one token is always left to compute: the step that samples the next token
        must run the model on something, so a fully cached prompt drops its last block.
        A request for prompt logprobs reuses nothing: the logits of the cached positions were
        never kept, so its prompt is recomputed (it still fills the cache for others)."""
        hashes = self._prompt_hashes(seq.token_ids, self.chain_root(seq))
        if self.prefix_cache is None or seq.params.prompt_logprobs is not None:
            return hashes, []
        cached = self.prefix_cache.lookup(hashes)
        if len(cached) * self.block_size >= len(seq):
            cached = cached[:-1]
        return hashes, cached

    def can_allocate(self, seq) -> bool:
        _, cached = self._cached_prefix(seq)
        reclaimed = sum(1 for b in cached if self.allocator.ref_counts[b] == 0)  # free now, taken by us
        needed = cdiv(len(seq), self.block_size) - len(cached)
        return needed + reclaimed <= self.allocator.num_free

    def num_tokens_to_compute(self, seq) -> int:
        """Tokens a waiting sequence would feed once its cached prefix is reused. The
        scheduler asks before allocating: a sequence that must wait then leaves the
        free pool's cached blocks (and the hit statistics) untouched."""
        _, cached = self._cached_prefix(seq)
        return len(seq) - len(cached) * self.block_size

    def allocate(self, seq) -> None:
        """Blocks for every token the sequence has now; cached prefix blocks are shared."""
        assert not seq.block_table, "sequence already holds blocks"
        hashes, cached = self._cached_prefix(seq)
        for b in cached:
            self.allocator.incref(b)
        seq.block_table = list(cached)
        seq.block_hashes = hashes[:len(cached)]
        seq.num_computed_tokens = len(cached) * self.block_size
        if not seq.admitted:              # what the request saved on arrival, not on a recompute
            seq.admitted = True
            seq.num_cached_tokens = seq.num_computed_tokens
            if self.prefix_cache is not None:
                self.prefix_cache.record(len(seq), seq.num_cached_tokens)
        while len(seq.block_table) < cdiv(len(seq), self.block_size):
            seq.block_table.append(self._new_block())

    def _new_block(self) -> int:
        block = self.allocator.allocate()
        if self.prefix_cache is not None:
            self.prefix_cache.forget(block)       # evicted: its old contents are gone
        return block

    # -- growing ---------------------------------------------------------------------
    def blocks_needed(self, seq, num_new_tokens: int) -> int:
        """Blocks a step writing `num_new_tokens` more tokens needs: new ones at the end,
        plus a private copy of each shared block that will be written."""
        end = seq.num_computed_tokens + num_new_tokens
        new = max(0, cdiv(end, self.block_size) - len(seq.block_table))
        first = seq.num_computed_tokens // self.block_size
        shared = sum(1 for b in seq.block_table[first:cdiv(end, self.block_size)]
                     if self.allocator.ref_counts[b] > 1)
        return new + shared

    def can_append(self, seq, num_new_tokens: int = 1) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.allocator.num_free

    def append_slots(self, seq, num_new_tokens: int = 1) -> None:
        """Make the slots of the next `num_new_tokens` positions writable by `seq` alone."""
        end = seq.num_computed_tokens + num_new_tokens
        first = seq.num_computed_tokens // self.block_size
        for i in range(first, min(len(seq.block_table), cdiv(end, self.block_size))):
            block = seq.block_table[i]
            if self.allocator.ref_counts[block] > 1:          # shared: copy before writing
                copy = self._new_block()
                self.ops.copies.append((block, copy))
                self.num_cow_copies += 1
                self.allocator.free(block)
                seq.block_table[i] = copy
        while len(seq.block_table) < cdiv(end, self.block_size):
            seq.block_table.append(self._new_block())

    def mark_computed(self, seq, num_new_tokens: int) -> None:
        """After a step: advance the sequence and name the blocks that just became full."""
        seq.num_computed_tokens += num_new_tokens
        full = seq.num_computed_tokens // self.block_size
        tokens = seq.token_ids
        while len(seq.block_hashes) < full:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else self.chain_root(seq)
            h = block_hash(parent, tokens[i * self.block_size:(i + 1) * self.block_size])
            seq.block_hashes.append(h)
            if self.prefix_cache is not None:
                self.prefix_cache.insert(h, seq.block_table[i])

    def trim(self, seq) -> None:
        """Give back the blocks past what the sequence's tokens need (slots of rejected drafts)."""
        keep = cdiv(len(seq), self.block_size)
        while len(seq.block_table) > keep:
            self.allocator.free(seq.block_table.pop())

    # -- sharing and freeing ---------------------------------------------------------
    def fork(self, parent, child) -> None:
        """The child shares every block of the parent (copy-on-write happens on write)."""
        for b in parent.block_table:
            self.allocator.incref(b)
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        child.admitted = True

    def free(self, seq) -> None:
        """Return the sequence's blocks, last first, so a prefix's first blocks stay
        cached longest (they are the most shareable)."""
        for b in reversed(seq.block_table):
            self.allocator.free(b)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    # -- swapping (lesson 06) ------------------------------------------------------------
    def can_swap_out(self, seq) -> bool:
        return self.cpu_allocator is not None and len(seq.block_table) <= self.cpu_allocator.num_free

    def swap_out(self, seq) -> None:
        """Copy the sequence's blocks to CPU blocks and free the device ones."""
        cpu_table = []
        for block in seq.block_table:
            cpu_block = self.cpu_allocator.allocate()
            self.ops.swap_out.append((block, cpu_block))
            self.allocator.free(block)
            cpu_table.append(cpu_block)
        seq.block_table = cpu_table
        self.num_swapped_out_blocks += len(cpu_table)

    def can_swap_in(self, seq, num_new_tokens: int = 1) -> bool:
        end = seq.num_computed_tokens + num_new_tokens
        return max(len(seq.block_table), cdiv(end, self.block_size)) <= self.allocator.num_free

    def swap_in(self, seq) -> None:
        """Fresh device blocks for the sequence, filled from its CPU blocks."""
        device_table = []
        for cpu_block in seq.block_table:
            block = self._new_block()
            self.ops.swap_in.append((cpu_block, block))
            self.cpu_allocator.free(cpu_block)
            device_table.append(block)
        seq.block_table = device_table
        self.num_swapped_in_blocks += len(device_table)

    def free_swapped(self, seq) -> None:
        """A swapped-out sequence ended: give back its CPU blocks."""
        for c in seq.block_table:
            self.cpu_allocator.free(c)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def take_ops(self) -> BlockOps:
        """The block moves queued since the last call; the engine applies them to the KV cache."""
        ops, self.ops = self.ops, BlockOps()
        return ops
