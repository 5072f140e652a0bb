"""Configuration dataclasses, validated on construction.

`ModelConfig` is the architecture of a Llama-family model, read from a Hugging Face
`config.json`. It keeps only what our forward needs, so a learner can see in one
screen every number that shapes the model.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None      # e.g. {"rope_type": "llama3", "factor": 8.0, ...}
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False          # Qwen2 has a bias on q/k/v projections
    qk_norm: bool = False                 # Qwen3 normalises q and k per head
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not supported; "
                             f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads "
                             f"(got {self.num_attention_heads} and {self.num_key_value_heads})")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    @classmethod
    def from_hf_dict(cls, d: dict) -> "ModelConfig":
        """Build from a transformers `config.json` dict (v4 or v5 spelling of RoPE)."""
        required = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads"]
        missing = [k for k in required if k not in d]
        if missing:
            raise ValueError(f"config.json is missing required key(s): {', '.join(missing)}")
        model_type = d.get("model_type", "llama")
        # transformers v5 nests RoPE settings under "rope_parameters"; v4 uses top-level keys.
        rope = dict(d.get("rope_parameters") or {})
        rope_theta = rope.pop("rope_theta", d.get("rope_theta", 10000.0))
        scaling = d.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if scaling is not None:
            scaling = dict(scaling)
            scaling.setdefault("rope_type", scaling.get("type", "default"))
            if scaling["rope_type"] == "default":
                scaling = None
        eos = d.get("eos_token_id")
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        heads = d["num_attention_heads"]
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            attention_bias=d.get("attention_bias", model_type == "qwen2"),
            qk_norm=model_type == "qwen3",
            model_type=model_type,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    def to_hf_dict(self) -> dict:
        """The transformers `config.json` for this architecture (used to build references)."""
        d = {
            "model_type": self.model_type,
            "architectures": [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                               "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[self.model_type]],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else self.eos_token_ids,
        }
        if self.rope_scaling:
            d["rope_scaling"] = dict(self.rope_scaling)
        if self.model_type == "llama":
            d["attention_bias"] = self.attention_bias
        return d


ATTENTION_BACKENDS = ("auto", "torch", "cpu-kernel")


def cache_dir() -> Path:
    """Where minillm keeps what it builds once (the converted embedded model, the compiled
    CPU kernel): $MINILLM_CACHE, else ~/.cache/minillm."""
    return Path(os.environ.get("MINILLM_CACHE", Path.home() / ".cache" / "minillm"))


@dataclass
class EngineConfig:
    """Engine options (vLLM's names). `num_kv_blocks=None` sizes the pool from
    `kv_cache_memory_bytes` (default: 1 GiB on CPU, 40 % of free memory on CUDA)."""
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = False
    scheduling_policy: str = "fcfs"       # "fcfs" | "priority" (lower value first)
    preemption_mode: str = "recompute"    # "recompute" | "swap"
    swap_space: int | None = None         # CPU blocks for swapping; default: as many as the device pool
    static_batching: bool = False         # lesson 05 baseline: admit a new batch only when the last is done
    attention_backend: str = "auto"       # "auto" (C decode kernel on CPU when it builds) | "torch" | "cpu-kernel"
    device: str | None = None
    dtype: str = "float32"

    def __post_init__(self):
        def positive(name):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("block_size", "num_kv_blocks", "kv_cache_memory_bytes", "max_num_seqs",
                     "max_num_batched_tokens", "max_model_len", "swap_space"):
            positive(name)
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")
        if self.device is not None and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
