"""Lesson 13's prefix-cache grader, `check_chain_root`: the learner's `chain_root(seq)`, the
parent of a sequence's first block (lesson 04's block_hash chains every later block to it), like
the package's `minillm.kv.prefix_cache.chain_root`.

    chain_root(seq) -> None for the base model (lesson 04's keys, unchanged)
                    -> bytes that name seq.lora_request's adapter: the same for the same adapter
                       in every process, different for different adapters

A key without the adapter does not crash anything: a prompt cached under one adapter is then
found for another (or for the base model), and its request runs on K/V computed with other
weights. So the grader names the two requests that would have shared blocks, then runs the key
in a real BlockManager: a prompt cached under adapter A, asked again under B, under the base
model, and under A.
"""
from __future__ import annotations

from .harness import Grader, expect, grader
from .lesson04_prefix_cache import _uses_builtin_hash


def _seq(i: int, tokens: list[int], lora):
    from ..engine.sequence import Sequence
    from ..sampling_params import SamplingParams
    return Sequence(i, f"req-{i}", list(tokens), SamplingParams(max_tokens=4), lora_request=lora)


def _root(g, fn, seq, label: str):
    with g.case(f"calling chain_root on {label}"):
        return fn(seq)


def _name(lora) -> str:
    return "the base model" if lora is None else \
        f"LoRARequest({lora.lora_name!r}, {lora.lora_int_id}, {lora.lora_path!r})"


@grader
def check_chain_root(fn) -> bool:
    """fn(seq) -> bytes | None, like `minillm.kv.prefix_cache.chain_root`: None for the base
    model; for an adapter, bytes that are equal for equal adapters (other objects, other
    prompts) and differ between adapters (two adapters may share a name); not Python's salted
    hash(). Then in a BlockManager whose chain_root is yours: a prompt cached under one adapter
    is reused under it, and never under another adapter or the base model."""
    from ..kv.block_manager import BlockManager
    from ..kv.prefix_cache import block_hash
    from ..lora.request import LoRARequest
    g = Grader("check_chain_root", "your chain_root")
    expect(callable(fn), f"check_chain_root takes your function chain_root, got {fn!r}")
    sql, chat = LoRARequest("sql", 1, "/adapters/sql"), LoRARequest("chat", 2, "/adapters/chat")
    prompt = [1, 5, 9, 2, 6, 5, 3, 5]

    base = _root(g, fn, _seq(0, prompt, None), "a base-model sequence (lora_request None)")
    expect(base is None, f"chain_root gave {base!r:.60} for a base-model sequence: the base model's chain starts "
                         "at None, as in lesson 04, so its blocks keep their keys (return None when "
                         "seq.lora_request is None)")
    root = _root(g, fn, _seq(1, prompt, sql), _name(sql))
    expect(root is not None, f"chain_root gave None for a sequence under {_name(sql)}: that is the base model's "
                             "root, so its blocks get the base model's keys: the key is without the adapter, and "
                             "a prompt cached under one adapter is found for every other and for the base "
                             "model (K/V computed with other weights). Return bytes that name the adapter")
    expect(isinstance(root, bytes), f"chain_root returned {type(root).__name__} {root!r:.60} for {_name(sql)}: "
                                    "return bytes (a digest, e.g. hashlib.sha256(...).digest()): block_hash feeds "
                                    "the root to hashlib.sha256 as the first block's parent")
    expect(not _uses_builtin_hash(fn),
           "chain_root uses Python's built-in hash(), which is salted: the same adapter would get another root "
           "in every process (PYTHONHASHSEED). Use hashlib over the adapter's identity")
    same = _root(g, fn, _seq(2, [7, 7, 7], LoRARequest("sql", 1, "/adapters/sql")),
                 f"another sequence (other tokens) under an equal {_name(sql)}")
    expect(same == root, f"two sequences under the same adapter, {_name(sql)} (two equal LoRARequest objects), "
                         "got different roots: the root names the adapter alone, not the sequence, its tokens or "
                         "the request object (no id(), no seq_id), so that its requests share their prefixes")
    other = _root(g, fn, _seq(3, prompt, chat), _name(chat))
    expect(other != root, f"{_name(sql)} and {_name(chat)} got the same root: each adapter must have its own, "
                          "else a prefix cached under one is reused for the other")
    twin = LoRARequest("sql", 3, "/adapters/sql-v2")
    expect(_root(g, fn, _seq(4, prompt, twin), _name(twin)) != root,
           f"{_name(sql)} and {_name(twin)} got the same root: two adapters may share a name (a name is for "
           "people; a new version of 'sql' is another adapter). Key on what identifies the adapter in the "
           "engine: its id (lora_int_id), and its folder (lora_path)")

    # a real BlockManager with your root: cache the prompt under sql, then ask under chat, base, sql
    class Yours(BlockManager):
        def chain_root(self, seq):
            return fn(seq)

    bm = Yours(num_blocks=16, block_size=4)
    first = _seq(10, prompt, sql)
    with g.case("allocating, computing and freeing a prompt under adapter 'sql' in a BlockManager"):
        bm.allocate(first)
        bm.mark_computed(first, len(prompt))
        bm.free(first)
    expect(first.block_hashes == [] and bm.prefix_cache.lookup([block_hash(root, prompt[:4])]),
           "the prompt's first block, cached under 'sql', is not named block_hash(chain_root(seq), tokens)")
    for lora, reused in ((chat, False), (None, False), (LoRARequest("sql", 1, "/adapters/sql"), True)):
        seq = _seq(11, prompt, lora)
        with g.case(f"asking the BlockManager how much of the prompt under {_name(lora)} is cached"):
            todo = bm.num_tokens_to_compute(seq)
        if reused:
            expect(todo < len(prompt), f"the prompt cached under 'sql' was not found again under {_name(lora)}: "
                                       "the same adapter must get the same root every time")
        else:
            expect(todo == len(prompt), f"the prompt cached under adapter 'sql' was found for {_name(lora)}: its "
                                        "request would run on K/V computed with the 'sql' adapter's weights")
    return g.passed()
