"""minillm: a small vLLM-style inference engine, built lesson by lesson."""
from .engine.engine import LLMEngine
from .llm import LLM
from .lora import LoRARequest
from .models import DEFAULT_MODEL, load_model, load_tokenizer
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams

__all__ = ["DEFAULT_MODEL", "LLM", "LLMEngine", "LoRARequest", "CompletionOutput", "RequestOutput", "SamplingParams",
           "load_model", "load_tokenizer"]
__version__ = "0.1.0"
