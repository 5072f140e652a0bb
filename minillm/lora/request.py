"""vLLM's `LoRARequest`: which adapter a request runs with.

    LoRARequest("sql", 1, "/adapters/sql")      # name, a positive id, the adapter folder

The id names the adapter inside the engine (its slot, its prefix-cache key); the name is
what a person reads; the path is a folder in peft's format (adapter.py). One id always means
one folder: a second request with the same id and another path is refused.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..utils.validate import is_int, refuse


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self):
        if not isinstance(self.lora_name, str) or not self.lora_name:
            refuse("lora_name", f"LoRARequest.lora_name must be a non-empty string, got {self.lora_name!r:.80}")
        if not is_int(self.lora_int_id) or self.lora_int_id < 1:
            refuse("lora_int_id", f"LoRARequest.lora_int_id must be an integer >= 1 (0 would be the base "
                                  f"model), got {self.lora_int_id!r:.80}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            refuse("lora_path", f"LoRARequest.lora_path must be a folder path, got {self.lora_path!r:.80}")

    @property
    def cache_salt(self) -> bytes:
        """What the prefix cache mixes into a chain's first hash (kv/prefix_cache.py): K/V
        computed under this adapter are never reused for another adapter or the base model."""
        return f"lora:{self.lora_int_id}:{self.lora_path}".encode()
