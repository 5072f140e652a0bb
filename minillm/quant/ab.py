"""Two builds of a quantized kernel timed against each other in ONE run:
`python -m minillm.quant.speed --against OLD.c [--shape llama-3.2-1b] [--head-only]`.

Why: on a machine shared with other jobs an absolute time says little. The same weights
through an older copy of quantized_linear.c (its int8_linear) or of w4a8_linear.c and through
the current file, timed in alternation in one process, give a ratio that does. Get the old
copy with `git show <commit>:minillm/quant/quantized_linear.c > /tmp/old.c`.

Weights are random codes (the kernels' speed does not depend on their values), one distinct
matrix per layer as in the model (one matrix again and again would be read from cache); the
head is the model's output head, in int8 whatever the layers are (quantize_model's default).
Both builds are called by ctypes with preallocated outputs: the kernels' own time.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from ..models.cpu_linear import to_panels
from ..models.shapes import shape_config
from ..utils.c_kernels import CKernel
from . import kernels, w4a8


def model_shapes(name: str) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """(every decoder layer's linear shapes (out, in), layer after layer; the head's) of a preset."""
    c = shape_config(name)
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    head_dim = c.get("head_dim") or hidden // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    layer = [(q, hidden), (kv, hidden), (kv, hidden), (hidden, q), (inter, hidden), (inter, hidden), (hidden, inter)]
    return layer * c["num_hidden_layers"], (c["vocab_size"], hidden)


def reads_halves(source: Path) -> bool:
    """Whether a w4a8_linear.c reads float16 scales (since float16 scales) or float32 ones (before)."""
    return "const uint16_t *sp" in source.read_text()


def builds(old_source: str | Path):
    """(kind "int8" | "w4a8", {"old" | "new": (library, reads float16 scales)}): which kernel
    from the functions the old file defines."""
    source = Path(old_source)
    text = source.read_text()
    kind, current = ("w4a8", w4a8.KERNEL) if "w4a8_linear(" in text else ("int8", kernels.KERNEL)
    if kind == "int8" and "int8_linear(" not in text:
        raise ValueError(f"{source} defines neither int8_linear nor w4a8_linear")
    old = CKernel(source, current.functions, current.flags)
    if old.load() is None or current.load() is None:
        raise RuntimeError(f"a build failed: old {old.load_error or 'ok'}; current {current.load_error or 'ok'}")
    return kind, {"old": (old.load(), reads_halves(source)), "new": (current.load(), reads_halves(current.source))}


def matrix_call(kind: str, lib, n: int, k: int, m: int, weights: dict, halves: bool = False):
    """A no-argument call of `lib`'s kernel on the [n, k] matrix `weights` holds, m random rows
    (w4a8: `halves`, the build reads float16 scales)."""
    x, y, threads = torch.randn(m, k), torch.empty(m, n), torch.get_num_threads()
    if kind == "int8":
        return lambda: lib.int8_linear(x.data_ptr(), m, k, weights["panels"].data_ptr(), weights["scale"].data_ptr(),
                                       n, y.data_ptr(), threads)
    sp, mp = (weights["sp16"], weights["mp16"]) if halves else (weights["sp"], weights["mp"])
    return lambda: lib.w4a8_linear(x.data_ptr(), m, k, weights["panels"].data_ptr(), sp.data_ptr(),
                                   mp.data_ptr(), 32, n, y.data_ptr(), threads)


def random_weights(kind: str, n: int, k: int) -> dict:
    """Random codes and scales of an [n, k] matrix in the kernel's layout (w4a8: groups of 32)."""
    if kind == "int8":
        return {"panels": to_panels(torch.randint(-127, 128, (n, k), dtype=torch.int8)), "scale": torch.rand(n) / 64}
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    sp, mp = to_panels(torch.rand(n, k // 32) / 64), to_panels(-torch.rand(n, k // 32) / 8)
    return {"panels": w4a8.pack_w4a8_panels(codes), "sp": sp, "mp": mp, "sp16": sp.half(), "mp16": mp.half()}


def alternate(calls: dict, repeats: int) -> dict:
    """{name: median ms}: each call warmed up once, then timed in alternation (order flipped every round)."""
    samples = {name: [] for name in calls}
    for fn in calls.values():
        fn()
    for i in range(repeats):
        for name in (list(calls) if i % 2 == 0 else list(calls)[::-1]):
            start = time.perf_counter()
            calls[name]()
            samples[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(s) for name, s in samples.items()}


@torch.inference_mode()
def compare(old_source, shape: str = "smollm2-135m", rows=(1, 8), repeats: int = 9, head_only: bool = False):
    """(kind, rows of (part, rows, old ms, new ms, old GB, new GB read per call)) for the old and current build."""
    kind, libs = builds(old_source)
    torch.manual_seed(0)
    layer_shapes, head = model_shapes(shape)
    if kind == "w4a8":                          # w4a8 runs the layers; the head is int8
        parts = {"layers": layer_shapes}
    else:
        parts = {"head": [head]} if head_only else {"head": [head], "layers": layer_shapes}
    results = []
    for part, shapes in parts.items():
        weights = [random_weights(kind, n, k) for n, k in shapes]
        weight_count = sum(n * k for n, k in shapes)
        for m in rows:
            calls = {name: [matrix_call(kind, lib, n, k, m, w, halves) for (n, k), w in zip(shapes, weights)]
                     for name, (lib, halves) in libs.items()}
            ms = alternate({name: (lambda fns=fns: [f() for f in fns]) for name, fns in calls.items()}, repeats)
            gigabytes = {name: weight_count * (1 if kind == "int8" else 0.5 + (4 if halves else 8) / 32) / 1e9
                         for name, (_, halves) in libs.items()}   # bytes a weight: codes + scale and minimum
            results.append((part, m, ms["old"], ms["new"], gigabytes["old"], gigabytes["new"]))
        del weights
    return kind, results


def print_comparison(old_source, shape: str, rows, repeats: int, head_only: bool) -> None:
    kind, results = compare(old_source, shape, rows, repeats, head_only)
    print(f"{kind}: {old_source} (old) vs the current source (new), {shape} shapes, "
          f"{torch.get_num_threads()} threads, median of {repeats} calls of each in alternation")
    print(f"{'part':<8}{'rows':>5}{'old ms':>10}{'new ms':>10}{'new/old':>9}{'old GB/s':>10}{'new GB/s':>10}")
    for part, m, old_ms, new_ms, old_gb, new_gb in results:
        print(f"{part:<8}{m:>5}{old_ms:>10.2f}{new_ms:>10.2f}{new_ms / old_ms:>9.3f}"
              f"{old_gb / old_ms * 1e3:>10.1f}{new_gb / new_ms * 1e3:>10.1f}")
