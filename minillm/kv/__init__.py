"""KV-cache memory schemes: contiguous (lesson 02), paged blocks (lesson 03+)."""
from .contiguous import ContiguousKVCache, generate_static_batch, generate_with_cache

__all__ = ["ContiguousKVCache", "generate_static_batch", "generate_with_cache"]
