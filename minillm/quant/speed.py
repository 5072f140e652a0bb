"""Kernel timings on SmolLM2-135M's linear shapes: `python -m minillm.quant.speed [--threads N]`.

For each way of computing y = x @ W.T it times every projection shape of one decoder layer
and multiplies by the 30 layers (the "layers" column), plus the output head separately, at
1, 8, 32 and 512 rows (batch-1 decode, small and large decode batches, a prefill chunk).
Random weights: the speed of these kernels does not depend on the values.

    float32      F.linear on column-major weights (what place_model does for nn.Linear)
    panel        float32 PanelLinear, the C kernel for small batches (cpu_linear.py)
    int8         Int8Linear: aten._weight_int8pack_mm up to 64 rows, else dequantize + F.linear
    int8-ref     dequantize_int8 then F.linear at every call (the reference path, CUDA's path)
    int4-g32     Int4Linear, group_size 32: aten._weight_int4pack_mm_for_cpu
    int4-g128    the same with group_size 128 (SmolLM2's K=576 is padded to 640)
    int4-ref     dequantize_int4 then F.linear at every call (group 32)
    w4a8         W4A8Linear, group 32: int4 weights x int8 activations, integer dot products
    bf16, int8-torch-bf16, int4-torch-bf16: bfloat16 weights and activations; the int ones run
                 torch's aten._weight_int8pack_mm / _weight_int4pack_mm_for_cpu (group 32)

Measured (2-core AMD EPYC, AVX-512, torch 2.13; load average ~7.5 from other jobs, so only
the ratios mean anything; re-measure on a quiet machine):
  - torch's packed kernels with float32 activations, one 1536x576 layer, 1 thread:
        rows        1        8        32       512
        float32   0.22 ms  0.97 ms  2.4 ms   26 ms
        int8      2.5 ms   19.5 ms  76 ms    28 ms (dequantize + F.linear above 64 rows)
        int4-g32  5.3 ms   42 ms    151 ms   1730 ms
    a scalar path: hence our C kernels (kernels.py). With bfloat16 activations the same ops
    are vectorized (1 row: bf16 F.linear 0.34, int8 0.30, int4 0.29 ms), so they serve bf16/fp16.
  - our C kernels, 60 distinct 1536x576 layers (no cache reuse), 1 thread, best of 5:
        rows        1         3         8
        float32   57-67 ms  160 ms    220-250 ms
        int8      17 ms     42 ms     93-118 ms      (3.3-3.9x at batch 1)
        int4-g32  80 ms     72 ms     152 ms         (g128: 66 ms at 1 row)
    int4 is compute-bound in this kernel (unpacking nibbles, two sums per group): at batch 1 it
    is barely faster than float32 here. w4a8 (int8 activations, integer dot products) is the
    faster 4-bit kernel: w4a8.py's docstring has its figures (quiet machine, 4.4x int4 at 8 rows).
  - the dequantize-then-F.linear reference (int8-ref, int4-ref) is 2-10x slower than float32 at
    every size: it reads the int weights AND writes and reads a float copy each call.

Old against new in one run (`--against OLD.c --shape llama-3.2-1b [--head-only]`, ab.py): an
older copy of a kernel's C file and the current one on the same random weights, in alternation;
the ratio is what holds on a loaded machine (quantized_linear.c's header has int8's figures).

Per-call cost of the C kernels (`--per-call`): each op at batch 1 on a tiny call (linear 64 ->
32, attention over 4 tokens: the call's overhead, not its arithmetic) and on SmolLM2's shapes
(the 576 x 576 q projection; attention: 9 heads over 3 KV heads of 64, 128 cached tokens),
called eagerly by ctypes (the fallback: Python makes the output, reads data_ptr()s, converts
every argument) and as the torch op whose CPU kernel is the C++ wrapper (utils/torch_ops.cpp).
Median of 5 rounds of 2000 calls, us, 1 thread, inference_mode; ROUGH: the 2-core EPYC had a
load average of 4-5 from other jobs (a second run moved single cells by up to 2x).
    op                        tiny: ctypes   C++ op     SmolLM2: ctypes   C++ op
    panel_linear                   10.8       4.9                87.2       82.4
    int8_linear                     8.1       4.5                47.4       44.7
    int4_linear                     8.3       7.0                47.7       47.2
    w4a8_linear                    11.2       7.1                20.7       16.6
    paged_decode_attention         11.5       4.9                57.9       63.1
The op was the cheaper call for every kernel in both runs at the tiny size (by 1.3-6.6 us);
at SmolLM2's sizes the kernel's own time dominates and the machine's noise hides the few us.
So the eager wrappers call the op where it is built. Inside a compiled graph (50 chained
int8_linear calls, 64 x 64, same machine) a call took 11.3 us with the op's Python+ctypes
kernel (MINILLM_NO_CPP_OPS=1) and 5.4 us with the C++ one.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from .int4 import Int4Linear
from .int8 import Int8Linear
from .w4a8 import W4A8Linear
from .reference import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8

LAYER_SHAPES = {"q": (576, 576), "k": (192, 576), "v": (192, 576), "o": (576, 576),
                "gate": (1536, 576), "up": (1536, 576), "down": (576, 1536)}     # (out, in)
HEAD_SHAPE = (49152, 576)
NUM_LAYERS = 30
ROWS = (1, 8, 32, 512)


def float_linear(linear):
    weight = linear.weight.detach().t().contiguous().t()       # column-major, as place_model lays it
    return lambda x: F.linear(x, weight)


def panel_linear(linear):
    from ..models.cpu_linear import PanelLinear, load_kernel
    kernel = load_kernel()
    big = linear.weight.numel() >= (1 << 19) and linear.out_features % 32 == 0
    return PanelLinear(linear, kernel) if kernel is not None and big else float_linear(linear)


def int8_reference(linear):
    q, scale = quantize_int8(linear.weight)
    return lambda x: F.linear(x, dequantize_int8(q, scale))


def int4_reference(linear):
    codes, scale, minimum = quantize_int4(linear.weight, 32)
    return lambda x: F.linear(x, dequantize_int4(codes, scale, minimum, 32))


def in_bfloat16(make):
    """The layer built from a bfloat16 copy of the weights, fed bfloat16 activations."""
    def build(linear):
        copy = nn.Linear(linear.in_features, linear.out_features, bias=False).bfloat16()
        copy.weight.data.copy_(linear.weight.detach())
        layer = make(copy)
        return lambda x: layer(x.bfloat16())
    return build


METHODS = {
    "float32": float_linear,
    "panel": panel_linear,
    "int8": Int8Linear.from_linear,
    "int8-ref": int8_reference,
    "int4-g32": lambda linear: Int4Linear.from_linear(linear, group_size=32),
    "int4-g128": lambda linear: Int4Linear.from_linear(linear, group_size=128),
    "int4-ref": int4_reference,
    "w4a8": lambda linear: W4A8Linear.from_linear(linear, group_size=32),
    "bf16": in_bfloat16(float_linear),
    "int8-torch-bf16": in_bfloat16(Int8Linear.from_linear),
    "int4-torch-bf16": in_bfloat16(lambda linear: Int4Linear.from_linear(linear, group_size=32)),
}


def time_ms(fn, repeats: int) -> float:
    """Median of `repeats` timed calls of fn() after one warm-up call, in milliseconds."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return 1e3 * statistics.median(samples)


@torch.inference_mode()
def measure(methods=tuple(METHODS), rows=ROWS, repeats: int = 5) -> dict:
    """{(method, rows): (ms for the NUM_LAYERS layers, ms for the head)}. Every layer has its own
    weights, as in the model: timing one matrix again and again would read it from cache."""
    torch.manual_seed(0)
    layers = [nn.Linear(k, n, bias=False) for _ in range(NUM_LAYERS) for n, k in LAYER_SHAPES.values()]
    head = nn.Linear(HEAD_SHAPE[1], HEAD_SHAPE[0], bias=False)
    results = {}
    for method in methods:
        built = [METHODS[method](linear) for linear in layers]
        built_head = METHODS[method](head)
        for m in rows:
            inputs = [torch.randn(m, linear.in_features) for linear in layers]
            x_head = torch.randn(m, HEAD_SHAPE[1])
            layer_ms = time_ms(lambda: [fn(x) for fn, x in zip(built, inputs)], repeats)
            results[method, m] = (layer_ms, time_ms(lambda: built_head(x_head), repeats))
        del built, built_head
    return results


SMOLLM2_CALL = ((576, 576), (9, 3, 64, 128))   # q projection; attention heads, KV heads, head dim, tokens
TINY_CALL = ((64, 32), (1, 1, 16, 4))          # so small that a call's time is its overhead


def op_cases(rows: int = 1, linear_shape=SMOLLM2_CALL[0], attention_shape=SMOLLM2_CALL[1]) -> dict:
    """{op name: (its ctypes call, the op, the arguments)} for each C kernel, random data: linears
    (in, out), paged attention `rows` queries of (heads, KV heads, head dim, cached tokens)."""
    from ..attention import cpu_paged
    from ..models.cpu_linear import load_kernel, run_kernel, to_panels
    from . import kernels, w4a8
    torch.manual_seed(0)
    (in_features, out_features), (heads, kv_heads, head_dim, tokens) = linear_shape, attention_shape
    linear = nn.Linear(in_features, out_features, bias=False)
    x = torch.randn(rows, in_features)
    i8, i4, wa = (Int8Linear.from_linear(linear), Int4Linear.from_linear(linear, group_size=32),
                  W4A8Linear.from_linear(linear, group_size=32))
    blocks = -(-tokens // 16)
    q, (k_cache, v_cache) = torch.randn(rows, heads, head_dim), torch.randn(2, blocks, 16, kv_heads, head_dim)
    tables, positions = torch.arange(blocks).repeat(rows, 1), torch.full((rows,), tokens - 1)
    ops = torch.ops.minillm
    return {
        "panel_linear": (lambda *a: run_kernel(load_kernel(), *a), ops.panel_linear, (x, to_panels(linear.weight))),
        "int8_linear": (kernels.int8_ctypes, ops.int8_linear, (x, i8.panels, i8.scale.float())),
        "int4_linear": (kernels.int4_ctypes, ops.int4_linear,
                        (x, i4.panels, i4.scale_panels, i4.minimum_panels, 32)),
        "w4a8_linear": (w4a8.w4a8_ctypes, ops.w4a8_linear, (x, wa.panels, wa.scale_panels, wa.minimum_panels, 32)),
        "paged_decode_attention": (lambda *a: cpu_paged.run_kernel(cpu_paged.load_kernel(), *a),
                                   ops.paged_decode_attention, (q, k_cache, v_cache, tables, positions)),
    }


@torch.inference_mode()
def per_call_us(calls=(TINY_CALL, SMOLLM2_CALL), repeats: int = 2000) -> dict:
    """{(op, "tiny" | "SmolLM2"): (us a call by ctypes, us by the op)} at batch 1: median of 5 rounds."""
    results = {}
    for name, shapes in zip(("tiny", "SmolLM2"), calls):
        for op, (by_ctypes, by_op, args) in op_cases(1, *shapes).items():
            results[op, name] = tuple(1e3 * time_ms(lambda: [fn(*args) for _ in range(repeats)], 5) / repeats
                                       for fn in (by_ctypes, by_op))
    return results


def print_per_call() -> None:
    from ..utils import native_ops
    from . import kernels
    if kernels.load_kernels() is None:
        return print(f"no C kernels here: {kernels.load_error}")
    if not native_ops.load():
        print(f"the C++ ops are not built ({native_ops.load_error}): the 'C++ op' column is the Python op")
    results = per_call_us()
    print(f"us per call at batch 1 ({torch.get_num_threads()} threads): ctypes | C++ op; tiny: {TINY_CALL}, "
          f"SmolLM2: {SMOLLM2_CALL} (linear in, out; attention heads, KV heads, head dim, tokens)")
    print(f"{'op':<24}{'tiny':>22}{'SmolLM2':>22}")
    for op in dict.fromkeys(op for op, _ in results):
        print(f"{op:<24}" + "".join(f"{results[op, s][0]:>12.1f} |{results[op, s][1]:>8.1f}"
                                    for s in ("tiny", "SmolLM2")))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--per-call", action="store_true", help="only the C kernels' per-call cost, ctypes vs C++ op")
    p.add_argument("--against", metavar="OLD.c", help="A/B in one run: an older quantized_linear.c (int8) or "
                   "w4a8_linear.c against the current file, on random weights of --shape (ab.py)")
    p.add_argument("--shape", default="smollm2-135m", help="with --against: a preset of models/shapes.py")
    p.add_argument("--rows", type=int, nargs="*", default=[1, 8], help="with --against: rows per call")
    p.add_argument("--head-only", action="store_true", help="with --against (int8): only the output head")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.per_call:
        return print_per_call()
    if args.against:
        from .ab import print_comparison
        return print_comparison(args.against, args.shape, args.rows, args.repeats, args.head_only)
    results = measure(args.methods, repeats=args.repeats)
    print(f"ms per step, {NUM_LAYERS} layers | output head ({torch.get_num_threads()} threads)")
    print(f"{'method':<10}" + "".join(f"{f'{m} rows':>22}" for m in ROWS))
    for method in args.methods:
        cells = "".join(f"{results[method, m][0]:>13.2f} |{results[method, m][1]:>7.2f}" for m in ROWS)
        print(f"{method:<10}{cells}")


if __name__ == "__main__":
    main()
