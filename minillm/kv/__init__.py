"""KV cache managers: contiguous per request (lesson 02), then paged blocks (lessons 03-06)."""
from .contiguous import ContiguousKVCache

__all__ = ["ContiguousKVCache"]
