"""Real models' shapes, for dummy weights (`load_format="dummy"`, dummy.py): the numbers of
their Hugging Face config.json, written out so that no download is needed to run a model of
that size. Only the shape is real; the weights are seeded random numbers.

Where each number comes from (the model's config.json on the hub, read 2024-2025):
  smollm2-135m   huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct/blob/main/config.json
                 (the embedded model: the same numbers as its GGUF's llama.* keys)
  smollm2-360m   huggingface.co/HuggingFaceTB/SmolLM2-360M-Instruct/blob/main/config.json
  smollm2-1.7b   huggingface.co/HuggingFaceTB/SmolLM2-1.7B-Instruct/blob/main/config.json
  llama-3.2-1b   huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json
                 (llama3 RoPE scaling: factor 32 over an original 8192-token context)
  qwen2.5-0.5b   huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json
                 (q/k/v carry biases, as every Qwen2 model)
All five tie the output head to the embedding and were initialised with initializer_range 0.02
(the scale dummy.py draws from). Token ids (bos/eos) are left out: dummy models use SmolLM2's
tokenizer and its special tokens (dummy.py says why).
"""
from __future__ import annotations

_SMOLLM2 = dict(model_type="llama", vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5,
                tie_word_embeddings=True, initializer_range=0.02)

SHAPES: dict[str, dict] = {
    "smollm2-135m": dict(_SMOLLM2, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0),
    "smollm2-360m": dict(_SMOLLM2, hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
                         num_attention_heads=15, num_key_value_heads=5, rope_theta=100000.0),
    "smollm2-1.7b": dict(_SMOLLM2, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                         num_attention_heads=32, num_key_value_heads=32, rope_theta=130000.0),
    "llama-3.2-1b": dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                         tie_word_embeddings=True, initializer_range=0.02),
    "qwen2.5-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                         tie_word_embeddings=True, initializer_range=0.02),
}


def shape_config(name: str) -> dict:
    """A preset's config.json dict (a copy), or a clear error naming the presets."""
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; presets: {', '.join(SHAPES)} "
                         "(or --hf-config path/to/config.json)")
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in SHAPES[name].items()}
