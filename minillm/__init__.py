"""minillm: a small vLLM-style inference engine, built lesson by lesson."""
from .models import DEFAULT_MODEL, load_model, load_tokenizer
from .outputs import CompletionOutput
from .sampling import SamplingParams

__all__ = ["DEFAULT_MODEL", "CompletionOutput", "SamplingParams", "load_model", "load_tokenizer"]
__version__ = "0.1.0"
