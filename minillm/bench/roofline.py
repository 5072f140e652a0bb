"""The roofline of one decode step: how close each attention backend comes to it.

A decode step feeds one token per sequence. It must read every weight once, read
each sequence's K/V for every layer, and write the new token's K/V; it does 2 FLOPs
per weight per token plus the attention's dot products. Against the machine's
measured read bandwidth B and compute ceiling P (`ceiling.py`), no step can be faster
than

    roofline time = max(bytes / B, FLOPs / P)

At batch 1 the weights dominate the bytes and the step is memory-bound; batching
shares the weights' bytes among more tokens (arithmetic intensity FLOPs / bytes
grows) until compute is the limit. Each backend's full decode step (the engine's
runner: forward and logits) is timed; its fraction of the roofline is roofline time
over measured time.

    python -m minillm bench roofline [--model M] [--batch-sizes 1 8 32] [--context 512]
                                     [--backends torch cpu-kernel] [--plot FILE] [--json FILE] [--quick]
                                     [engine flags: --dtype bfloat16, --quantization int8, ...]

The engine flags are cli/engine_args.py's; the bench sets what its measurement needs itself
(the KV pool, seats and length for each batch and context, no prefix caching, the backend of
each row: `--attention-backend X` alone runs X's rows).
"""
from __future__ import annotations

import dataclasses
import json
import time

import torch

from ..cli.engine_args import add_engine_arguments, engine_config_from_args
from ..utils import cdiv

from .ceiling import layer_matmul_params, matmul_flops_per_second, read_bandwidth_bytes_per_second
from .decode_step import FakeSequence

BACKENDS_BY_DEVICE = {"cpu": ("torch", "cpu-kernel"), "cuda": ("torch", "triton")}


def decode_step_bytes(c, batch_size: int, context_len: int, dtype_bytes: int) -> dict:
    """Bytes a decode step must move: each sequence has `context_len` tokens cached and
    feeds one more, which attends to context_len + 1 keys (its own included)."""
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    per_layer = layer_matmul_params(c) + 2 * c.hidden_size                  # + the two RMSNorms
    per_layer += (q + 2 * kv) * c.attention_bias + 2 * c.head_dim * c.qk_norm
    weight_params = (c.num_hidden_layers * per_layer
                     + c.vocab_size * c.hidden_size + c.hidden_size      # output head, final norm
                     + batch_size * c.hidden_size)                       # the embedding rows looked up
    kv_per_token = c.num_hidden_layers * 2 * kv * dtype_bytes           # K and V, every layer
    b = {"weights": weight_params * dtype_bytes,
         "kv_read": batch_size * (context_len + 1) * kv_per_token,
         "kv_written": batch_size * kv_per_token}
    b["total"] = sum(b.values())
    return b


def decode_step_flops(c, batch_size: int, context_len: int) -> int:
    """Multiply-adds x 2: the projections and MLP, attention (q.k and p.v over
    context_len + 1 keys per head), and the output head, for every fed token."""
    q = c.num_attention_heads * c.head_dim
    per_token = (2 * layer_matmul_params(c) * c.num_hidden_layers
                 + 4 * q * (context_len + 1) * c.num_hidden_layers
                 + 2 * c.hidden_size * c.vocab_size)
    return batch_size * per_token


def roofline_seconds(nbytes: float, flops: float, bandwidth: float, peak_flops: float) -> float:
    return max(nbytes / bandwidth, flops / peak_flops)


def available_backends(device: torch.device, dtype: torch.dtype) -> list[str]:
    """The registered backends that run on this device (the C kernel: float32 on CPU, if it builds)."""
    from ..attention import ATTENTION_BACKENDS
    from ..attention.cpu_paged import kernel_available
    names = [n for n in BACKENDS_BY_DEVICE.get(device.type, ("torch",)) if n in ATTENTION_BACKENDS]
    if "cpu-kernel" in names and not (dtype == torch.float32 and kernel_available()):
        names.remove("cpu-kernel")
    return names


def time_decode_step(model, tokenizer, backend: str, batch_size: int, context_len: int, repeats: int,
                     config=None) -> float:
    """Median seconds of the engine runner's decode step (forward + logits) for `batch_size`
    sequences of `context_len` cached tokens (the KV values do not change the work). `config`:
    the other engine options (default: EngineConfig's)."""
    from ..config import EngineConfig
    from ..engine.engine import LLMEngine
    config = config or EngineConfig()
    block_size = config.block_size
    blocks_per_seq = cdiv(context_len + 1, block_size)
    engine = LLMEngine(model, tokenizer, dataclasses.replace(
        config, attention_backend=backend, num_kv_blocks=batch_size * blocks_per_seq + 1, max_num_seqs=batch_size,
        max_model_len=context_len + block_size, enable_prefix_caching=False))
    seqs = [FakeSequence(list(range(100 + i, 100 + i + context_len + 1)),
                         list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq))) for i in range(batch_size)]
    scheduled = [(s, 1) for s in seqs]
    cuda = model.device.type == "cuda"
    times = []
    for attempt in range(repeats + 2):                 # two warm-ups: kernels built, graphs captured
        start = time.perf_counter()
        engine.runner.execute(scheduled)
        if cuda:
            torch.cuda.synchronize(model.device)
        if attempt >= 2:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure(model, tokenizer, batch_sizes, context_len: int, backends, repeats: int,
            bandwidth: float, peak_flops: float, config=None) -> list[dict]:
    rows, c = [], model.config
    for batch_size in batch_sizes:
        nbytes = decode_step_bytes(c, batch_size, context_len, model.dtype.itemsize)
        flops = decode_step_flops(c, batch_size, context_len)
        roof = roofline_seconds(nbytes["total"], flops, bandwidth, peak_flops)
        for backend in backends:
            seconds = time_decode_step(model, tokenizer, backend, batch_size, context_len, repeats, config)
            rows.append({"batch_size": batch_size, "backend": backend, "bytes": nbytes, "flops": flops,
                         "intensity": flops / nbytes["total"],
                         "bound": "memory" if nbytes["total"] / bandwidth >= flops / peak_flops else "compute",
                         "roofline_ms": 1000 * roof, "measured_ms": 1000 * seconds,
                         "achieved_flops_per_s": flops / seconds, "fraction_of_roofline": roof / seconds})
    return rows


def plot_roofline(report: dict, path: str) -> None:
    """Arithmetic intensity vs attainable FLOP/s (log-log): the roof, and each backend's point."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bw, peak, rows = report["bandwidth_bytes_per_s"], report["peak_flops_per_s"], report["rows"]
    lo = min(r["intensity"] for r in rows) / 4
    hi = max(4 * max(r["intensity"] for r in rows), 4 * peak / bw)
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(xs, [min(peak, x * bw) for x in xs], color="black", label="roofline (measured here)")
    markers = dict(zip(sorted({r["backend"] for r in rows}), "osD^v*"))
    for backend, marker in markers.items():
        mine = [r for r in rows if r["backend"] == backend]
        ax.loglog([r["intensity"] for r in mine], [r["achieved_flops_per_s"] for r in mine], marker,
                  linestyle="none", label=backend)
        for r in mine:
            ax.annotate(f"b={r['batch_size']} ({100 * r['fraction_of_roofline']:.0f}%)",
                        (r["intensity"], r["achieved_flops_per_s"]), fontsize=7,
                        textcoords="offset points", xytext=(4, -10))
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(f"decode step roofline: {report['model']}, {report['dtype']}, {report['device']}, "
                 f"context {report['context']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args) -> dict:
    from ..models import load_model
    from ..models.loader import resolve_dtype

    torch.manual_seed(0)
    config = engine_config_from_args(args)               # a bad flag fails here, before loading
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = resolve_dtype(config.dtype, device)
    model, tokenizer = load_model(args.model, device=str(device), dtype=dtype)
    batch_sizes, context, repeats = args.batch_sizes, args.context, args.repeats
    if args.quick:
        batch_sizes, context, repeats = [b for b in batch_sizes if b <= 8] or [1], min(context, 64), 3
    chosen = [config.attention_backend] if config.attention_backend != "auto" else None
    backends = args.backends or chosen or available_backends(device, dtype)
    seconds = 0.2 if args.quick else 1.0
    bandwidth = read_bandwidth_bytes_per_second(device, 2 ** 26 if args.quick else None, seconds)
    peak = matmul_flops_per_second(device, 4096 if device.type == "cuda" else 1024, seconds, dtype)
    print(f"{args.model or 'SmolLM2-135M-Instruct'} on {device} in {dtype}; measured now: read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s, {str(dtype).split('.')[-1]} matmul {peak / 1e9:.0f} GFLOP/s", flush=True)
    print(f"{'batch':>5} {'backend':<11}{'MB moved':>9}{'GFLOP':>8}{'FLOP/B':>8}{'bound':>8}"
          f"{'roof ms':>9}{'step ms':>9}{'roofline':>10}")
    rows = measure(model, tokenizer, batch_sizes, context, backends, repeats, bandwidth, peak, config)
    for r in rows:
        print(f"{r['batch_size']:>5} {r['backend']:<11}{r['bytes']['total'] / 1e6:>9.1f}{r['flops'] / 1e9:>8.2f}"
              f"{r['intensity']:>8.1f}{r['bound']:>8}{r['roofline_ms']:>9.2f}{r['measured_ms']:>9.2f}"
              f"{100 * r['fraction_of_roofline']:>9.1f}%", flush=True)
    report = {"model": args.model or "SmolLM2-135M-Instruct", "device": str(device),
              "dtype": str(dtype).split(".")[-1], "context": context, "batch_sizes": batch_sizes,
              "backends": backends, "bandwidth_bytes_per_s": bandwidth, "peak_flops_per_s": peak,
              "quick": args.quick, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot:
        plot_roofline(report, args.plot)
    return report


def add_arguments(p) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--context", type=int, default=512, help="tokens already cached per sequence")
    p.add_argument("--backends", nargs="+", default=None, help="default: those that run on the device")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--plot", default=None, help="write the roofline chart here (PNG)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--quick", action="store_true", help="small batches and context for a smoke run")
    add_engine_arguments(p)
