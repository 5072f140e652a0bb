"""Models: our Llama-family forward and the loaders that feed it weights."""
from .llama import LlamaForCausalLM
from .loader import DEFAULT_MODEL, default_device, load_model, load_tokenizer
from .tiny import TINY_CONFIGS

__all__ = ["LlamaForCausalLM", "DEFAULT_MODEL", "TINY_CONFIGS", "default_device",
           "load_model", "load_tokenizer"]
