"""What `LLMEngine.stats()` reports: counters of the scheduler, the block manager, the prefix
cache and speculation, and the resolved configuration with the reason for each value."""
from __future__ import annotations


def engine_stats(engine) -> dict:
    bm, pc = engine.block_manager, engine.block_manager.prefix_cache
    out = {
        "num_preemptions": engine.scheduler.num_preemptions,
        "num_recomputed_tokens": engine.scheduler.num_recomputed_tokens,
        "num_cow_copies": bm.num_cow_copies,
        "num_swapped_out_blocks": bm.num_swapped_out_blocks,
        "num_swapped_in_blocks": bm.num_swapped_in_blocks,
        "prefix_cache_hit_rate": pc.hit_rate if pc else 0.0,
        "kv_blocks_used": bm.allocator.num_blocks - bm.num_free_blocks,
        "kv_blocks_total": bm.allocator.num_blocks,
        "attention_backend": engine.resolved.attention_backend,
        "tensor_parallel_size": engine.config.tensor_parallel_size,
        "quantization": engine.resolved.quantization,
        "config": engine.resolved.as_dict(),          # every derived value, with its reason
    }
    if engine.speculator is not None:
        out.update(engine.speculator.stats())
    return out
