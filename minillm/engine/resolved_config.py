"""Every value the engine derives from its options, resolved once, each with its reason.

Building an engine goes one way: options (EngineConfig) + the model -> this object ->
the runner (model, KV cache, attention backend) -> the scheduler. No module goes back to
the engine for a value another one computed; `engine.stats()["config"]` shows them all.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..attention import auto_backend
from ..config import DEFAULT_CHUNKED_BUDGET, EngineConfig, SchedulerConfig
from ..models.loader import resolve_dtype
from ..utils import cdiv
from ..lora.manager import refuse_lora_combinations

DEFAULT_CPU_KV_BYTES = 1 << 30          # the pool on CPU when nothing is asked for
DEFAULT_CUDA_KV_FRACTION = 0.4          # of the GPU's free memory


@dataclass(frozen=True)
class ResolvedConfig:
    device: torch.device
    dtype: torch.dtype
    num_kv_blocks: int
    max_model_len: int
    max_num_batched_tokens: int
    num_swap_blocks: int                # CPU blocks for swapping (0: preemption recomputes)
    attention_backend: str
    quantization: str | None
    vocab_size: int
    memory: dict                        # bytes: weights, kv_pool, swap, available (checked before allocating)
    reasons: dict                       # field -> why it has this value

    def scheduler_config(self, config: EngineConfig) -> SchedulerConfig:
        return SchedulerConfig(config.max_num_seqs, self.max_num_batched_tokens, config.enable_chunked_prefill,
                               config.scheduling_policy, config.preemption_mode)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["device"], d["dtype"] = str(self.device), str(self.dtype).removeprefix("torch.")
        return d


def bytes_per_kv_block(model_config, block_size: int, dtype: torch.dtype) -> int:
    c = model_config
    return 2 * c.num_hidden_layers * block_size * c.num_key_value_heads * c.head_dim * dtype.itemsize


def resolve_config(config: EngineConfig, model) -> ResolvedConfig:
    """Resolve `config` for `model` (a ValueError with the fix for what cannot be held)."""
    if config.enable_lora:
        refuse_lora_combinations(config)
    reasons = {}
    device = torch.device(config.device) if config.device is not None else model.device
    reasons["device"] = "asked for" if config.device is not None else "the model's own"
    dtype = model.dtype if config.dtype in (None, "auto") else resolve_dtype(config.dtype)
    reasons["dtype"] = "asked for" if config.dtype not in (None, "auto") else "the model's own"
    num_blocks, reasons["num_kv_blocks"] = _num_kv_blocks(config, model.config, device, dtype)
    max_model_len, reasons["max_model_len"] = _max_model_len(config, model.config, num_blocks)
    budget, reasons["max_num_batched_tokens"] = _token_budget(config, max_model_len)
    swap = (config.swap_space or num_blocks) if config.preemption_mode == "swap" else 0
    reasons["num_swap_blocks"] = ("none: preemption recomputes" if not swap else
                                  "asked for" if config.swap_space else "as many as the device pool")
    backend = config.attention_backend
    if backend == "auto":
        backend = auto_backend(device, dtype)
        reasons["attention_backend"] = f"auto on {device.type} {str(dtype).removeprefix('torch.')}"
    else:
        reasons["attention_backend"] = "asked for"
    memory = check_memory_budget(model, device, dtype, num_blocks, swap,
                                 bytes_per_kv_block(model.config, config.block_size, dtype))
    return ResolvedConfig(device, dtype, num_blocks, max_model_len, budget, swap, backend,
                          config.quantization, model.config.vocab_size, memory, reasons)


def available_bytes(device: torch.device) -> int:
    """What the device can still hold: CUDA's free memory, or on CPU the kernel's MemAvailable
    (RAM it can hand out without swapping; the loaded weights are already counted as used)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil
        return psutil.virtual_memory().available
    except ImportError:
        return 1 << 62          # nothing tells us: no check (macOS without psutil)


def check_memory_budget(model, device, dtype, num_blocks: int, swap_blocks: int, per_block: int) -> dict:
    """The KV pool (and swap space) must fit what the machine has, checked before anything is
    allocated: a clear ValueError with the numbers and the fix, never the allocator's raw error
    or the OOM killer. Swap space lives in host memory: on CPU it shares RAM with the pool."""
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    pool, swap = num_blocks * per_block, swap_blocks * per_block
    memory = {"weights": weights, "kv_pool": pool, "swap": swap}
    host_need = swap + (pool if device.type == "cpu" else 0)
    checks = [("host", host_need, available_bytes(torch.device("cpu")))]
    if device.type == "cuda":
        checks.insert(0, (str(device), pool, available_bytes(device)))
    for where, need, have in checks:
        memory[f"available_{where}"] = have
        if need > have:
            raise ValueError(
                f"the KV cache does not fit {where} memory: {num_blocks} blocks x {per_block} bytes = "
                f"{pool / 2**30:.2f} GiB for the pool" + (f" + {swap / 2**30:.2f} GiB of swap space" if swap else "")
                + f", but {have / 2**30:.2f} GiB is available (weights: {weights / 2**30:.2f} GiB); lower "
                f"num_kv_blocks (at most {max(0, have - (swap if where != 'host' else 0)) // per_block} here) or "
                "kv_cache_memory_bytes" + (", or swap_space" if swap else ""))
    return memory


def _num_kv_blocks(config, model_config, device, dtype) -> tuple[int, str]:
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks, "asked for"
    per_block = bytes_per_kv_block(model_config, config.block_size, dtype)
    budget = config.kv_cache_memory_bytes
    why = f"kv_cache_memory_bytes={budget}"
    if budget is None and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = int(DEFAULT_CUDA_KV_FRACTION * free)
        why = f"{DEFAULT_CUDA_KV_FRACTION:.0%} of the GPU's free memory"
    elif budget is None:
        budget, why = DEFAULT_CPU_KV_BYTES, "1 GiB, the CPU default"
    return max(1, budget // per_block), f"{why} / {per_block} bytes per block"


def _max_model_len(config, model_config, num_blocks: int) -> tuple[int, str]:
    """The longest sequence (prompt + output) the engine accepts. Asked for: refused,
    with the fix, when the model or the pool cannot hold it. Not asked for: the
    model's limit, or what the pool holds when that is less (one sequence must
    always fit alone, or preemption could not make progress)."""
    limit = model_config.max_position_embeddings
    pool = num_blocks * config.block_size
    asked = config.max_model_len
    if asked is None:
        return (limit, "the model's max_position_embeddings") if limit <= pool else (pool, "what the pool holds")
    if asked > limit:
        raise ValueError(f"max_model_len={asked} is more than the model's max_position_embeddings={limit}")
    if asked > pool:
        raise ValueError(f"max_model_len={asked} does not fit the KV pool: {num_blocks} blocks of "
                         f"{config.block_size} tokens hold {pool}; raise num_kv_blocks to at least "
                         f"{cdiv(asked, config.block_size)} (or kv_cache_memory_bytes), "
                         "or lower max_model_len")
    return asked, "asked for"


def _token_budget(config, max_model_len: int) -> tuple[int, str]:
    if config.max_num_batched_tokens is not None:
        budget, why = config.max_num_batched_tokens, "asked for"
    elif config.enable_chunked_prefill:
        budget, why = DEFAULT_CHUNKED_BUDGET, "the default with chunked prefill"
    else:
        budget, why = max(DEFAULT_CHUNKED_BUDGET, max_model_len), "without chunked prefill: a whole prompt"
    if not config.enable_chunked_prefill and budget < max_model_len:
        raise ValueError(f"max_num_batched_tokens={budget} < max_model_len={max_model_len}: a long prompt "
                         "could never be scheduled; enable chunked prefill, raise max_num_batched_tokens "
                         "or lower max_model_len")
    return budget, why
