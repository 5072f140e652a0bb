"""Configuration dataclasses, validated on construction.

`ModelConfig` is the architecture of a Llama-family model, read from a Hugging Face
`config.json`. It keeps only what our forward needs, so a learner can see in one
screen every number that shapes the model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .utils.registry import ATTENTION_BACKENDS, LINEAR_BACKENDS
from .utils.validate import Validated, check_bool, check_choice, check_int, fail
from .spec.config import SpeculativeConfig

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


SCHEDULING_POLICIES = ("fcfs", "priority")      # lesson 05: order by arrival, or by (priority, arrival)
PREEMPTION_MODES = ("recompute", "swap")        # lesson 06: what a preempted sequence does with its KV
DTYPES = ("auto", "float32", "float16", "bfloat16")   # "auto": models/loader.py resolve_dtype
DEVICES = ("cpu", "cuda")
LOAD_FORMATS = ("auto", "dummy")                # "dummy": seeded random weights of the shape (models/dummy.py)
DEFAULT_CHUNKED_BUDGET = 2048                   # tokens per step with chunked prefill, as vLLM


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's slice of a validated EngineConfig, with the token budget resolved
    (engine/resolved_config.py). No checks of its own: EngineConfig made them."""
    max_num_seqs: int = 64
    max_num_batched_tokens: int = DEFAULT_CHUNKED_BUDGET
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"
    preemption_mode: str = "recompute"


def option(default, help: str):
    """A field of EngineConfig with the help text that `--help` shows (cli/engine_args.py)."""
    return field(default=default, metadata={"help": help})


@dataclass
class EngineConfig(Validated):
    """Engine options (vLLM's names), checked strictly on construction and on change.

    Every field is also a command-line flag of `serve`, `generate`, `chat` and the benches
    (`--block-size`, ...), with the type, default and help written here (cli/engine_args.py).
    """
    block_size: int = option(16, "tokens per KV block")
    num_kv_blocks: int | None = option(
        None, "KV blocks in the device pool (default: sized from kv_cache_memory_bytes)")
    kv_cache_memory_bytes: int | None = option(
        None, "bytes for the KV pool when num_kv_blocks is not set (default: 1 GiB on CPU, 40 percent of free "
              "memory on CUDA)")
    max_num_seqs: int = option(64, "sequences running at once at most (a request with n samples takes n)")
    max_num_batched_tokens: int | None = option(
        None, "tokens per step at most (default: 2048 with chunked prefill, else max(2048, max_model_len))")
    max_model_len: int | None = option(
        None, "longest prompt + output (default: the model's context, or what the pool holds if less; "
              "asked for and impossible: refused, never lowered)")
    enable_prefix_caching: bool = option(True, "reuse the KV blocks of prompt prefixes seen before")
    enable_chunked_prefill: bool = option(True, "split long prompts over steps within the token budget")
    scheduling_policy: str = option("fcfs", "fcfs: by arrival; priority: by (priority, arrival), lower first")
    preemption_mode: str = option("recompute", "what a preempted sequence does with its KV: recompute or swap")
    swap_space: int | None = option(None, "CPU blocks for swapping (default: as many as the device pool)")
    attention_backend: str = option("auto", "auto, or a registered attention backend (minillm.utils.registry)")
    device: str | None = option(None, "cpu, cuda or cuda:N (default: the model's own; LLM loads on CUDA "
                                      "when there is one)")
    dtype: str | None = option("auto", "auto (bfloat16 or float16 on a GPU, float32 on CPU, for weights "
                                       "minillm loads), float32, float16 or bfloat16")
    load_format: str = option("auto", "auto: the model's weights; dummy: seeded random weights of its shape, "
                                      "nothing downloaded (--model a preset such as llama-3.2-1b, or a "
                                      "config.json; models/dummy.py): for speed measurements only")
    compile: bool = option(False, "decode steps through torch.compile, one graph per batch-size bucket")
    enforce_eager: bool = option(False, "on CUDA: no CUDA graphs for decode steps")
    quantization: str | None = option(None, "weight-only linears: a registered linear backend (int8, int4, "
                                            "w4a8) or none")
    speculative_config: dict | None = option(None, "speculative decoding, vLLM's shape, as JSON: "
                                                   "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}' "
                                                   "(minillm/spec/config.py lists the keys)")
    tensor_parallel_size: int = option(1, "ranks the model's layers are sharded over, one process each "
                                          "(gloo on CPU, NCCL on CUDA; minillm/distributed/)")
    pipeline_parallel_size: int = option(1, "stages the decoder layers are split into (balanced by cost), "
                                            "each in its own rank(s), hidden states passed on (minillm/distributed/)")
    nnodes: int = option(1, "machines the tensor x pipeline ranks run on (node 0: the engine and the API)")
    node_rank: int = option(0, "this machine's node (0: the head; others run headless ranks: README, multi-node)")
    dist_init_addr: str | None = option(None, "HOST:PORT of node 0's rendezvous (torch.distributed TCPStore); "
                                              "ranks bind only to their node's address")
    enable_lora: bool = option(False, "serve LoRA adapters (peft's format) beside the base model, per request "
                                      "(minillm/lora/)")
    max_loras: int = option(1, "with enable_lora: adapters in the model's slots at once (others wait in host memory)")
    max_lora_rank: int = option(16, "with enable_lora: the highest adapter rank served (the slots' size)")

    def validate(self) -> None:
        name = "EngineConfig"
        for field_name in ("block_size", "max_num_seqs", "tensor_parallel_size", "pipeline_parallel_size", "nnodes",
                           "max_loras", "max_lora_rank"):
            check_int(name, field_name, getattr(self, field_name), minimum=1)
        for field_name in ("num_kv_blocks", "kv_cache_memory_bytes", "max_num_batched_tokens",
                           "max_model_len", "swap_space"):
            check_int(name, field_name, getattr(self, field_name), minimum=1, optional=True)
        for field_name in ("enable_prefix_caching", "enable_chunked_prefill"):
            check_bool(name, field_name, getattr(self, field_name))
        check_int(name, "node_rank", self.node_rank, minimum=0)     # with nnodes, dist_init_addr: distributed/launch.py
        check_bool(name, "compile", self.compile)
        check_bool(name, "enable_lora", self.enable_lora)
        check_bool(name, "enforce_eager", self.enforce_eager)
        check_choice(name, "scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        check_choice(name, "preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        check_choice(name, "attention_backend", self.attention_backend, ("auto", *ATTENTION_BACKENDS.names()))
        check_choice(name, "dtype", self.dtype, DTYPES, optional=True)
        check_choice(name, "load_format", self.load_format, LOAD_FORMATS)
        check_choice(name, "quantization", self.quantization, sorted(LINEAR_BACKENDS.names()), optional=True)
        object.__setattr__(self, "speculative_config", SpeculativeConfig.coerce(self.speculative_config))
        if self.device is not None:
            if not isinstance(self.device, str):
                fail(name, "device", "'cpu', 'cuda', 'cuda:N' or None", self.device, TypeError)
            kind, _, index = self.device.partition(":")
            if kind not in DEVICES or (index and not (kind == "cuda" and index.isdigit())):
                fail(name, "device", "'cpu', 'cuda', 'cuda:N' or None", self.device)
