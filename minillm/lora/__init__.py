"""Lesson 13: many fine-tunes on one base model (batched multi-LoRA serving)."""
from .adapter import LoRAAdapter, load_adapter
from .batched_delta import gathered_delta, grouped_delta
from .request import LoRARequest

__all__ = ["LoRAAdapter", "LoRARequest", "gathered_delta", "grouped_delta", "load_adapter"]
